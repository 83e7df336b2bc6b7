package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A run index's progress is one line on a terminal that clears when the
// last run is read, and nothing at all when stderr is a file or a pipe.
func TestProgressOfRunsRead(t *testing.T) {
	for _, tc := range []struct {
		name  string
		calls [][2]int
		want  []string // in order
		not   []string
	}{
		{name: "a cold index", calls: [][2]int{{1, 3}, {2, 3}, {3, 3}}, want: []string{"index: 1 of 3 runs read", "\r\033[K"}},
		{name: "one run grew: nothing to show", calls: [][2]int{{1, 1}}, not: []string{"runs read"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			p := &progress{w: &b, name: "index", tty: true}
			for _, c := range tc.calls {
				p.runs(c[0], c[1])
			}
			got := b.String()
			at := 0
			for _, w := range tc.want {
				i := strings.Index(got[at:], w)
				if i < 0 {
					t.Fatalf("progress %q lacks %q (in order)", got, w)
				}
				at += i + len(w)
			}
			if len(tc.want) > 0 && !strings.HasSuffix(got, "\r\033[K") {
				t.Errorf("the line is not cleared at the end: %q", got)
			}
			for _, n := range tc.not {
				if strings.Contains(got, n) {
					t.Errorf("progress %q shows %q", got, n)
				}
			}
		})
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := newProgress(f, "index")
	p.runs(1, 3)
	p.runs(3, 3)
	if info, _ := f.Stat(); info.Size() != 0 {
		t.Errorf("progress wrote %d bytes to a file", info.Size())
	}
}
