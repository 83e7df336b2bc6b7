package receipt

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildOfARunChangedUnderIt rewrites or cuts a run file while the
// build holds it mapped (ReadRunFileHeld): the build fails with an error
// saying so, and what it wrote before is a prefix of the true output,
// never bytes it did not check. Small runs read and print on the calling
// goroutine; large ones on the package's own.
func TestBuildOfARunChangedUnderIt(t *testing.T) {
	tm, err := Bundled("x402-buyer")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{3, 40_000} {
		path := filepath.Join(t.TempDir(), "run.ndjson")
		writeBuyerRun(t, path, n)
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		want := buildText(t, string(text), tm)
		// Where a byte of an event id near the end can change in place.
		at := strings.LastIndex(string(text), `"event_id":"`) + len(`"event_id":"`)

		t.Run(fmt.Sprintf("%d events rewritten", n), func(t *testing.T) {
			evs := readHeld(t, path, text)
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte{'Z'}, int64(at)); err != nil {
				t.Fatal(err)
			}
			f.Close()
			var got bytes.Buffer
			err = Guard(func() error { return WriteBuild(&got, evs, tm) })
			if !errors.Is(err, ErrRunChanged) || !strings.Contains(err.Error(), "line ") {
				t.Fatalf("%d events, one rewritten: error %v, want ErrRunChanged with its line", n, err)
			}
			if !bytes.HasPrefix(want, got.Bytes()) || got.Len() >= len(want) {
				t.Fatalf("%d events: wrote %d bytes, not a strict prefix of the %d-byte build", n, got.Len(), len(want))
			}
		})

		t.Run(fmt.Sprintf("%d events cut", n), func(t *testing.T) {
			evs := readHeld(t, path, text)
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			err = Guard(func() error { return WriteBuild(&got, evs, tm) })
			if !errors.Is(err, ErrRunCut) {
				t.Fatalf("%d events, file cut: error %v, want ErrRunCut", n, err)
			}
			if !bytes.HasPrefix(want, got.Bytes()) || got.Len() >= len(want) {
				t.Fatalf("%d events: wrote %d bytes, not a strict prefix of the %d-byte build", n, got.Len(), len(want))
			}
		})

		t.Run(fmt.Sprintf("%d events appended to", n), func(t *testing.T) {
			evs := readHeld(t, path, text)
			// A recorder appending is not a change: what was read stays.
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteString(goodLine + "\n"); err != nil {
				t.Fatal(err)
			}
			f.Close()
			var got bytes.Buffer
			if err := Guard(func() error { return WriteBuild(&got, evs, tm) }); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Fatalf("%d events, appended to: the build differs", n)
			}
		})
	}
}

// TestGuardLeavesOtherPanics: only a fault on mapped memory becomes an
// error; a bug's panic (here a nil dereference) stays a panic.
func TestGuardLeavesOtherPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("a nil dereference inside Guard did not panic")
		}
	}()
	var p *Event
	_ = Guard(func() error { return errors.New(p.ID) })
}

// readHeld writes text to path and reads it back mapped, held until the
// test ends.
func readHeld(t *testing.T, path string, text []byte) []Event {
	t.Helper()
	if err := os.WriteFile(path, text, 0o600); err != nil {
		t.Fatal(err)
	}
	_, evs, release, err := ReadRunFileHeld(path, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return evs
}
