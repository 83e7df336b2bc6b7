package filestore_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// The file store records the policy in effect in guard/policy-in-effect.json.
func TestPolicyRecordFileStore(t *testing.T) {
	st, reopen, _ := fileStores(t)
	ctx := context.Background()
	read := func(s reviewlog.Store) (reviewlog.PolicyRecord, bool) {
		t.Helper()
		var rec reviewlog.PolicyRecord
		var ok bool
		if err := s.View(ctx, func(r reviewlog.Reader) error {
			var err error
			rec, ok, err = r.Policy(ctx)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return rec, ok
	}
	if _, ok := read(st); ok {
		t.Fatal("a new store has a policy recorded")
	}
	for _, want := range []reviewlog.PolicyRecord{
		{Source: "/etc/haia/policy.json", SHA256: strings.Repeat("ab", 32), Text: `{"reviewTtlMinutes": 60}`, At: "2026-12-01T10:00:00Z"},
		{Source: "built-in defaults", At: "2026-12-01T11:00:00Z"},
	} {
		if err := st.Locked(ctx, time.Second, func(w reviewlog.Writer) error { return w.SetPolicy(ctx, want) }); err != nil {
			t.Fatal(err)
		}
		// Another process (another handle) reads what was recorded last.
		if got, ok := read(reopen()); !ok || got != want {
			t.Fatalf("recorded %+v, read %+v (%v)", want, got, ok)
		}
	}
}

// A tampered record file is an error naming the file, never a crash or a
// silent default.
func TestPolicyRecordTamperedFile(t *testing.T) {
	st, _, _ := fileStores(t)
	ctx := context.Background()
	var dir string
	if err := st.Locked(ctx, time.Second, func(w reviewlog.Writer) error {
		dir = filepath.Dir(w.Locate(reviewlog.FileName))
		return w.SetPolicy(ctx, reviewlog.PolicyRecord{Source: "built-in defaults", At: "t"})
	}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, reviewlog.PolicyFile), []byte(`{"source": 7}`), 0o644); err != nil {
		t.Fatal(err)
	}
	err := st.View(ctx, func(r reviewlog.Reader) error { _, _, err := r.Policy(ctx); return err })
	if err == nil || !strings.Contains(err.Error(), reviewlog.PolicyFile) {
		t.Fatalf("tampered record: %v", err)
	}
}
