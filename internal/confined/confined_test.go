package confined

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"
)

func setup(t *testing.T) (*Dir, string) {
	t.Helper()
	base := t.TempDir()
	root := filepath.Join(base, "root")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{root, outside, filepath.Join(root, "events")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(root, "events", "good.ndjson"), "{}\n")
	write(filepath.Join(outside, "secret.ndjson"), "secret\n")
	must(t, os.Symlink(filepath.Join(outside, "secret.ndjson"), filepath.Join(root, "events", "out.ndjson")))
	must(t, os.Symlink("good.ndjson", filepath.Join(root, "events", "in.ndjson")))
	must(t, os.Symlink(outside, filepath.Join(root, "linkdir")))
	must(t, syscall.Mkfifo(filepath.Join(root, "events", "pipe.ndjson"), 0o644))
	must(t, os.Mkdir(filepath.Join(root, "events", "dir.ndjson"), 0o755))
	d, err := OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, root
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestOpenRefusals(t *testing.T) {
	root, _ := setup(t)
	events, err := root.OpenDir("events")
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	cases := []struct {
		name    string
		wantErr error
		wantMsg string
	}{
		{"good.ndjson", nil, ""},
		{"out.ndjson", ErrSymlink, "symbolic link refused"},
		{"in.ndjson", ErrSymlink, "symbolic link refused"},
		{"pipe.ndjson", ErrNotRegular, "FIFO"},
		{"dir.ndjson", ErrNotRegular, "directory"},
		{"../outside", ErrBadName, "single path element"},
		{"", ErrBadName, "single path element"},
		{"missing.ndjson", fs.ErrNotExist, "missing.ndjson"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, err := events.Open(c.name)
			if c.wantErr == nil {
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				f.Close()
				return
			}
			if err == nil {
				f.Close()
				t.Fatalf("open %q succeeded, want %v", c.name, c.wantErr)
			}
			if !errors.Is(err, c.wantErr) || !strings.Contains(err.Error(), c.wantMsg) {
				t.Fatalf("open %q: %v, want %v mentioning %q", c.name, err, c.wantErr, c.wantMsg)
			}
		})
	}
}

func TestOpenDirRefusesSymlink(t *testing.T) {
	root, _ := setup(t)
	if _, err := root.OpenDir("linkdir"); !errors.Is(err, ErrSymlink) {
		t.Fatalf("OpenDir(linkdir) = %v, want ErrSymlink", err)
	}
}

func TestReadDirKinds(t *testing.T) {
	root, _ := setup(t)
	events, err := root.OpenDir("events")
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	entries, err := events.ReadDir()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range entries {
		got[e.Name] = e.Kind()
	}
	want := map[string]string{
		"good.ndjson": "regular file", "out.ndjson": "symbolic link", "in.ndjson": "symbolic link",
		"pipe.ndjson": "FIFO", "dir.ndjson": "directory",
	}
	for name, kind := range want {
		if got[name] != kind {
			t.Errorf("%s: kind %q, want %q", name, got[name], kind)
		}
	}
}

func TestFSBoundsAndRefusals(t *testing.T) {
	root, _ := setup(t)
	events, err := root.OpenDir("events")
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	fsys := events.FS(2)
	if _, err := fs.ReadFile(fsys, "good.ndjson"); err == nil || !strings.Contains(err.Error(), "larger than 2 bytes") {
		t.Fatalf("bounded read: %v", err)
	}
	if data, err := fs.ReadFile(events.FS(100), "good.ndjson"); err != nil || string(data) != "{}\n" {
		t.Fatalf("read: %q %v", data, err)
	}
	if _, err := fs.ReadFile(fsys, "out.ndjson"); !errors.Is(err, ErrSymlink) {
		t.Fatalf("symlink through FS: %v", err)
	}
	if _, err := fsys.Open("a/b"); err == nil {
		t.Fatal("nested path accepted")
	}
}

func TestWriteFileAtomic(t *testing.T) {
	root, dir := setup(t)
	if err := root.WriteFileAtomic("k.json", []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := root.WriteFileAtomic("k.json", []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "k.json"))
	if err != nil || string(data) != "two" {
		t.Fatalf("content %q, %v", data, err)
	}
	st, _ := os.Stat(filepath.Join(dir, "k.json"))
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode())
	}
	// A symlink in the way is refused, not followed.
	if err := root.WriteFileAtomic("linkdir", []byte("x"), 0o600); err != nil {
		t.Fatalf("replacing a link by rename should work on the link itself: %v", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "outside", "x")); err == nil {
		t.Fatal("wrote through a symlinked directory")
	}
}

func TestOpenDirLazy(t *testing.T) {
	dir := t.TempDir()
	root, err := OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	events, err := root.OpenDirLazy("events")
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	if events.Exists() {
		t.Fatal("events exists before it was made")
	}
	if list, err := events.ReadDir(); err != nil || len(list) != 0 {
		t.Fatalf("ReadDir before it exists: %v %v", list, err)
	}
	if _, err := events.Open("run.ndjson"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open before it exists: %v", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "events"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "events", "run.ndjson"), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if list, err := events.ReadDir(); err != nil || len(list) != 1 {
		t.Fatalf("ReadDir once it exists: %v %v", list, err)
	}
	// A symbolic link in its place is refused, as by OpenDir.
	other := filepath.Join(t.TempDir(), "x")
	os.Mkdir(other, 0o755)
	os.Symlink(other, filepath.Join(dir, "linked"))
	lazy, err := root.OpenDirLazy("linked")
	if err == nil {
		lazy.Close()
		t.Fatal("a symbolic link was accepted")
	}
}

func TestScratchAndWriteReadersAtomic(t *testing.T) {
	dir := t.TempDir()
	root, err := OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	f, err := root.Scratch("index.bodies")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The scratch file has no name: nothing is left behind, whatever
	// becomes of the process.
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Fatalf("the directory holds %v (%v), want nothing", ents, err)
	}
	if _, err := f.WriteString("tail of the file"); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		parts []io.Reader
		want  string
	}{
		{"bytes and a scratch file's section", []io.Reader{strings.NewReader("head "), io.NewSectionReader(f, 0, 4)}, "head tail"},
		{"nothing", nil, ""},
		{"the whole scratch file", []io.Reader{io.NewSectionReader(f, 0, 16)}, "tail of the file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := root.WriteReadersAtomic("out.bin", 0o600, c.parts...); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(dir, "out.bin"))
			if err != nil || string(got) != c.want {
				t.Fatalf("out.bin holds %q (%v), want %q", got, err, c.want)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 1 {
				t.Fatalf("the directory holds %v, want out.bin alone", ents)
			}
		})
	}
	// A reader that fails leaves the file as it was.
	bad := io.MultiReader(strings.NewReader("part"), iotest.ErrReader(errors.New("disk gone")))
	if err := root.WriteReadersAtomic("out.bin", 0o600, bad); err == nil {
		t.Fatal("a failed part was written")
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "out.bin")); string(got) != "tail of the file" {
		t.Fatalf("after a failed write out.bin holds %q", got)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("a failed write left %v", ents)
	}
}
