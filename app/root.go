package app

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/app/catalog"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// DefaultPolicyName is the policy file init writes beside a Trace root,
// where the server and the review commands look when no policy is named.
const DefaultPolicyName = "haia-guard.config.json"

// maxTemplateBytes bounds what one operator template file may cost.
const maxTemplateBytes = 1 << 20

// Root is an open Trace root: events/ (what the recorders write), guard/
// (the file store) and templates/ (the operator's templates), all confined
// to the real path resolved once at open.
type Root struct {
	dir    *confined.Dir
	events *confined.Dir
	// borrowed: dir belongs to the caller of RootOf and stays open.
	borrowed bool
}

// RootError is a Trace root that cannot be opened; Err says why (it wraps
// fs.ErrNotExist when there is nothing at Dir).
type RootError struct {
	Dir string
	Err error
}

func (e *RootError) Error() string {
	return fmt.Sprintf("the Trace root %s cannot be opened: %v", e.Dir, e.Err)
}
func (e *RootError) Unwrap() error { return e.Err }

// ErrNotTraceRoot is a directory that holds neither events/ nor guard/.
var ErrNotTraceRoot = errors.New("not a Trace root: it holds neither events/ nor guard/")

// OpenRoot opens dir as a Trace root. A root from nothing has no events/
// until a recorder first writes; it is opened lazily.
func OpenRoot(dir string) (*Root, error) {
	d, err := confined.OpenRoot(dir)
	if err != nil {
		return nil, &RootError{Dir: dir, Err: err}
	}
	events, err := d.OpenDirLazy("events")
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("trace root %s: events directory: %w", d.Path(), err)
	}
	return &Root{dir: d, events: events}, nil
}

// RootOf is the Trace root of a directory the caller opened and keeps:
// Close releases only what the Root opened itself.
func RootOf(dir *confined.Dir) (*Root, error) {
	events, err := dir.OpenDirLazy("events")
	if err != nil {
		return nil, fmt.Errorf("trace root %s: events directory: %w", dir.Path(), err)
	}
	return &Root{dir: dir, events: events, borrowed: true}, nil
}

// Dir is the root directory.
func (r *Root) Dir() *confined.Dir { return r.dir }

// Path is the root's real path.
func (r *Root) Path() string { return r.dir.Path() }

// Events is the root's events/ directory (it may not exist yet).
func (r *Root) Events() *confined.Dir { return r.events }

// Close releases the root's directories.
func (r *Root) Close() {
	r.events.Close()
	if !r.borrowed {
		r.dir.Close()
	}
}

// CheckError is an entry of the root that exists but cannot be opened.
type CheckError struct {
	Name string
	Err  error
}

func (e *CheckError) Error() string { return e.Name + ": " + e.Err.Error() }
func (e *CheckError) Unwrap() error { return e.Err }

// Check says whether the root is a Trace root: it holds events/ or guard/
// (or both). A wrong folder must not look like an empty queue: it is
// ErrNotTraceRoot; an entry that exists but cannot be opened a *CheckError.
func (r *Root) Check() error {
	found := false
	for _, name := range []string{"events", reviewlog.DirName} {
		d, err := r.dir.OpenDir(name)
		if err == nil {
			d.Close()
			found = true
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return &CheckError{Name: name, Err: err}
		}
	}
	if !found {
		return ErrNotTraceRoot
	}
	return nil
}

// PolicyFile is where init writes the guard policy of this root: beside it.
func (r *Root) PolicyFile() string { return PolicyFileBeside(r.Path()) }

// PolicyFileBeside is the policy file beside the Trace root at rootPath.
func PolicyFileBeside(rootPath string) string {
	return filepath.Join(filepath.Dir(rootPath), DefaultPolicyName)
}

// Templates loads the operator's templates (templatesDir, else the root's
// templates/ when it exists) and the bundled ones, and logs each with its
// SHA-256; an operator file that replaces a bundled template is allowed
// (it is the operator's choice) and logged as such. The set stays fixed
// until reloaded.
func (r *Root) Templates(templatesDir string, logger *slog.Logger) (*receipt.TemplateSet, error) {
	var tdir *confined.Dir
	var err error
	name := "templates"
	if templatesDir != "" {
		if tdir, err = confined.OpenRoot(templatesDir); err != nil {
			return nil, fmt.Errorf("--templates-dir: %w", err)
		}
		name = tdir.Path()
	} else if tdir, err = r.dir.OpenDir("templates"); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("trace root %s: templates directory: %w", r.Path(), err)
		}
		tdir = nil
	}
	load := func() (*receipt.Registry, []error) {
		if tdir == nil {
			return receipt.LoadRegistry(nil, "", nil)
		}
		entries, err := tdir.ReadDir()
		if err != nil {
			return nil, []error{fmt.Errorf("templates directory: %w", err)}
		}
		var names []string
		for _, e := range entries {
			if e.Regular() {
				names = append(names, e.Name)
			}
		}
		return receipt.LoadRegistry(tdir.FS(maxTemplateBytes), name, names)
	}
	set, errs := receipt.NewTemplateSet(load)
	if set == nil {
		return nil, errors.Join(errs...)
	}
	LogTemplates(set.Current(), errs, logger, "templates loaded")
	return set, nil
}

// LogTemplates logs the templates of a registry and those that failed.
func LogTemplates(r *receipt.Registry, errs []error, logger *slog.Logger, msg string) {
	for _, l := range r.Loaded() {
		if l.Overrides {
			logger.Warn(msg+": an operator template replaces the bundled one", "template", l.Name, "source", l.Source, "sha256", l.SHA256)
			continue
		}
		logger.Info(msg, "template", l.Name, "source", l.Source, "sha256", l.SHA256)
	}
	for _, err := range errs {
		logger.Error(msg+": a template could not be loaded and cannot be used until it is fixed and the server reloaded (SIGHUP)", "err", err)
	}
}

// Catalog is the read model of this root under templates, its run index
// bounded by maxBytes (0: the default) and saved in state (nil: never);
// progress, when set, follows the runs a refresh must read, and reading
// is told before a refresh reads run files (catalog.Config.Reading).
// saveDelay is a test hook (catalog.Config.SaveDelay).
func (r *Root) Catalog(templates receipt.TemplateSource, maxBytes int64, saveDelay time.Duration, state *confined.Dir, logger *slog.Logger, progress func(done, total int), reading func(bytes int64) func()) (*catalog.Catalog, error) {
	return catalog.New(catalog.Config{Root: r.dir, Events: r.events, Templates: templates, Limits: receipt.DefaultLimits(), MaxBytes: maxBytes, State: state, Logger: logger, Progress: progress, Reading: reading, SaveDelay: saveDelay})
}

// InitRoot makes the Trace root layout at dir from nothing — dir, events/
// (where recorders write), templates/ (the operator's templates) and
// guard/ (0700, the file store) — leaving what exists as it is. It returns
// what it made, one line each; an entry that exists and is not a
// directory stops it.
func InitRoot(dir string) (made []string, err error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{abs, 0o755}, {filepath.Join(abs, "events"), 0o755}, {filepath.Join(abs, "templates"), 0o755}, {filepath.Join(abs, reviewlog.DirName), 0o700}} {
		if st, err := os.Lstat(d.path); err == nil {
			if !st.IsDir() {
				return made, fmt.Errorf("%s exists and is not a directory", d.path)
			}
			continue
		}
		if err := os.Mkdir(d.path, d.mode); err != nil {
			return made, err
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			return made, err
		}
		made = append(made, fmt.Sprintf("directory %s (%o)", d.path, d.mode))
	}
	return made, nil
}
