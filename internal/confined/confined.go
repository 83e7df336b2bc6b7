// Package confined opens files beneath a directory that was resolved once,
// refusing symbolic links at every step and never blocking on special files.
//
// Every lookup is a single openat(2) relative to an open directory
// descriptor with O_NOFOLLOW, followed by fstat(2) of the descriptor that was
// actually opened, so there is no gap between checking a file and using it.
package confined

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrSymlink is returned when a name refers to a symbolic link.
var ErrSymlink = errors.New("symbolic link refused")

// ErrNotRegular is returned when a file is not a regular file (a FIFO, a
// device, a socket or a directory where a file was expected).
var ErrNotRegular = errors.New("not a regular file")

// ErrBadName is returned for names that are not a single path element.
var ErrBadName = errors.New("name must be a single path element")

// Dir is an open directory. It is safe for concurrent use.
type Dir struct {
	fd   int
	path string
	// lazy is set for a child directory opened with OpenDirLazy: it is
	// opened on first use once it exists.
	lazy *lazyChild
}

type lazyChild struct {
	mu     sync.Mutex
	parent *Dir
	name   string
	open   bool
}

// OpenDirLazy is OpenDir for a child directory that may not exist yet (a
// recorder creates events/ when it first writes): until it exists, ReadDir
// lists nothing and Open finds nothing; once it does, it is opened (with the
// same refusals as OpenDir) and used from then on. The parent must stay
// open.
func (d *Dir) OpenDirLazy(name string) (*Dir, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	c := &Dir{fd: -1, path: filepath.Join(d.path, name), lazy: &lazyChild{parent: d, name: name}}
	if err := c.ensure(); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return c, nil
}

// Exists says whether a lazy directory exists (always true for others).
func (d *Dir) Exists() bool { return d.ensure() == nil }

// ensure opens a lazy directory that has come to exist; fs.ErrNotExist
// while it does not.
func (d *Dir) ensure() error {
	if d.lazy == nil {
		return nil
	}
	d.lazy.mu.Lock()
	defer d.lazy.mu.Unlock()
	if d.lazy.open {
		return nil
	}
	c, err := d.lazy.parent.OpenDir(d.lazy.name)
	if err != nil {
		return err
	}
	d.fd, d.lazy.open = c.fd, true
	return nil
}

// OpenRoot resolves path to its real path once and opens it. The real path
// is what every later lookup is confined to.
func OpenRoot(path string) (*Dir, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", path, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", path, err)
	}
	fd, err := unix.Open(real, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open directory %s: %w", real, err)
	}
	return &Dir{fd: fd, path: real}, nil
}

// Path is the directory's real path, for messages.
func (d *Dir) Path() string { return d.path }

// Close releases the directory descriptor.
func (d *Dir) Close() error {
	if d.lazy != nil {
		d.lazy.mu.Lock()
		defer d.lazy.mu.Unlock()
		if !d.lazy.open {
			return nil
		}
	}
	return unix.Close(d.fd)
}

func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') || strings.ContainsRune(name, 0) {
		return fmt.Errorf("%q: %w", name, ErrBadName)
	}
	return nil
}

// OpenDir opens the child directory name, refusing a symbolic link.
func (d *Dir) OpenDir(name string) (*Dir, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := d.ensure(); err != nil {
		return nil, err
	}
	fd, err := unix.Openat(d.fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, d.explain(name, err)
	}
	return &Dir{fd: fd, path: filepath.Join(d.path, name)}, nil
}

// MkdirAll opens the child directory name, creating it with perm when absent.
func (d *Dir) MkdirAll(name string, perm os.FileMode) (*Dir, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := unix.Mkdirat(d.fd, name, uint32(perm.Perm())); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("create directory %s: %w", filepath.Join(d.path, name), err)
	}
	return d.OpenDir(name)
}

// Open opens the regular file name for reading. A symbolic link, a FIFO, a
// device or a directory is refused without blocking.
func (d *Dir) Open(name string) (*os.File, error) {
	return d.OpenFile(name, os.O_RDONLY, 0)
}

// OpenFile opens the regular file name with flag (os.O_* values) and, when
// it is created, perm. The file is checked after it is opened.
func (d *Dir) OpenFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := d.ensure(); err != nil {
		return nil, fmt.Errorf("open %s: %w", filepath.Join(d.path, name), err)
	}
	fd, err := unix.Openat(d.fd, name, flag|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		return nil, d.explain(name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat %s: %w", filepath.Join(d.path, name), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w (%s)", filepath.Join(d.path, name), ErrNotRegular, kindOf(st.Mode))
	}
	// The descriptor stays non-blocking; for regular files that changes nothing,
	// but clear it so callers get ordinary blocking semantics. F_SETFL
	// changes only the status flags (O_APPEND, O_NONBLOCK, ...), so the
	// flags asked for without O_NONBLOCK are what it must hold: one call,
	// not a read of the flags first.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, flag&^unix.O_NONBLOCK); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open %s: %w", filepath.Join(d.path, name), err)
	}
	return os.NewFile(uintptr(fd), filepath.Join(d.path, name)), nil
}

// explain turns an openat error into one that names the file and says
// plainly when a symbolic link was the cause.
func (d *Dir) explain(name string, err error) error {
	full := filepath.Join(d.path, name)
	if errors.Is(err, unix.ELOOP) {
		return fmt.Errorf("%s: %w", full, ErrSymlink)
	}
	if errors.Is(err, unix.ENOTDIR) {
		var st unix.Stat_t
		if unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return fmt.Errorf("%s: %w", full, ErrSymlink)
		}
		return fmt.Errorf("%s: not a directory", full)
	}
	if errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%s: %w", full, fs.ErrNotExist)
	}
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		return fmt.Errorf("%s: %w", full, fs.ErrPermission)
	}
	return fmt.Errorf("open %s: %w", full, err)
}

// Entry is one name in a directory listing with its type, as lstat sees it.
type Entry struct {
	Name    string
	Type    fs.FileMode // fs.ModeSymlink, fs.ModeDir, fs.ModeNamedPipe, ... or 0 for a regular file
	Size    int64
	ModTime time.Time
	Dev     uint64
	Ino     uint64
}

// Regular reports whether the entry is a regular file.
func (e Entry) Regular() bool { return e.Type == 0 }

// Kind names the entry's type for messages.
func (e Entry) Kind() string {
	switch {
	case e.Type == 0:
		return "regular file"
	case e.Type&fs.ModeSymlink != 0:
		return "symbolic link"
	case e.Type&fs.ModeDir != 0:
		return "directory"
	case e.Type&fs.ModeNamedPipe != 0:
		return "FIFO"
	case e.Type&fs.ModeSocket != 0:
		return "socket"
	case e.Type&fs.ModeDevice != 0:
		return "device"
	default:
		return "special file"
	}
}

// ReadDir lists the directory, lstat-ing each entry without following links.
// Entries that vanish between listing and stat are left out.
func (d *Dir) ReadDir() ([]Entry, error) {
	if err := d.ensure(); errors.Is(err, fs.ErrNotExist) {
		return nil, nil // a lazy directory that does not exist yet holds nothing
	} else if err != nil {
		return nil, err
	}
	fd, err := unix.Openat(d.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.path, err)
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("list %s: %w", d.path, err)
	}
	out := make([]Entry, 0, len(names))
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue
		}
		out = append(out, Entry{
			Name:    name,
			Type:    modeType(st.Mode),
			Size:    st.Size,
			ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
			Dev:     uint64(st.Dev),
			Ino:     st.Ino,
		})
	}
	return out, nil
}

func modeType(m uint32) fs.FileMode {
	switch m & unix.S_IFMT {
	case unix.S_IFREG:
		return 0
	case unix.S_IFDIR:
		return fs.ModeDir
	case unix.S_IFLNK:
		return fs.ModeSymlink
	case unix.S_IFIFO:
		return fs.ModeNamedPipe
	case unix.S_IFSOCK:
		return fs.ModeSocket
	case unix.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		return fs.ModeDevice
	default:
		return fs.ModeIrregular
	}
}

func kindOf(m uint32) string { return Entry{Type: modeType(m)}.Kind() }

// FS exposes the directory's regular files as a flat fs.FS (no
// subdirectories), with the same refusals as Open. maxBytes bounds what
// ReadFile will read from one file.
func (d *Dir) FS(maxBytes int64) fs.FS { return dirFS{d: d, max: maxBytes} }

type dirFS struct {
	d   *Dir
	max int64
}

func (f dirFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) || strings.ContainsRune(name, '/') || name == "." {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	file, err := f.d.Open(name)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	return file, nil
}

// ReadFile reads a whole file, refusing one larger than the bound.
func (f dirFS) ReadFile(name string) ([]byte, error) {
	file, err := f.Open(name)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	data, err := io.ReadAll(io.LimitReader(file, f.max+1))
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: name, Err: err}
	}
	if int64(len(data)) > f.max {
		return nil, &fs.PathError{Op: "read", Path: name, Err: fmt.Errorf("file larger than %d bytes", f.max)}
	}
	return data, nil
}

// WriteFileAtomic replaces name with data: it writes a new file beside it,
// syncs it and renames it into place, so a reader sees the old or the new
// content, never a part. The caller serializes writers (a lock).
func (d *Dir) WriteFileAtomic(name string, data []byte, perm os.FileMode) error {
	return d.WritePartsAtomic(name, perm, data)
}

// WritePartsAtomic is WriteFileAtomic of the parts one after another, for
// a writer that would otherwise copy them into one buffer first.
func (d *Dir) WritePartsAtomic(name string, perm os.FileMode, parts ...[]byte) error {
	rs := make([]io.Reader, len(parts))
	for i, p := range parts {
		rs[i] = bytes.NewReader(p)
	}
	return d.WriteReadersAtomic(name, perm, rs...)
}

// WriteReadersAtomic is WritePartsAtomic of what each reader yields, for a
// writer whose parts are too large to hold in memory (a scratch file).
func (d *Dir) WriteReadersAtomic(name string, perm os.FileMode, parts ...io.Reader) error {
	if err := checkName(name); err != nil {
		return err
	}
	tmp := "." + name + ".tmp"
	_ = unix.Unlinkat(d.fd, tmp, 0)
	f, err := d.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	for _, part := range parts {
		if _, err := io.Copy(f, part); err != nil {
			f.Close()
			_ = unix.Unlinkat(d.fd, tmp, 0)
			return fmt.Errorf("write %s: %w", filepath.Join(d.path, name), err)
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		_ = unix.Unlinkat(d.fd, tmp, 0)
		return fmt.Errorf("sync %s: %w", filepath.Join(d.path, name), err)
	}
	if err := f.Close(); err != nil {
		_ = unix.Unlinkat(d.fd, tmp, 0)
		return fmt.Errorf("close %s: %w", filepath.Join(d.path, name), err)
	}
	if err := unix.Renameat(d.fd, tmp, d.fd, name); err != nil {
		_ = unix.Unlinkat(d.fd, tmp, 0)
		return fmt.Errorf("rename into %s: %w", filepath.Join(d.path, name), err)
	}
	return nil
}

// Scratch creates a new file in the directory that has no name: it is
// removed as soon as it is open, so that it is gone when the caller closes
// it or the process stops, whatever happens meanwhile. The caller closes it.
func (d *Dir) Scratch(prefix string) (*os.File, error) {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	name := "." + prefix + "." + hex.EncodeToString(rnd[:])
	f, err := d.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Unlinkat(d.fd, name, 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("remove the scratch file %s: %w", filepath.Join(d.path, name), err)
	}
	return f, nil
}

// Writable reports whether this process may create files in the directory.
func (d *Dir) Writable() error {
	if err := unix.Faccessat(d.fd, ".", unix.W_OK, unix.AT_EACCESS); err != nil {
		return fmt.Errorf("%s is not writable: %w", d.path, err)
	}
	return nil
}
