package receipt

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"sync/atomic"
)

// Registry is a fixed set of templates, read once: the operator's templates
// directory first, then the bundled ones. Nothing written into the directory
// afterwards changes it; a new Registry is loaded only when the operator asks
// (SIGHUP), so what the guard judges by cannot change under it.
type Registry struct {
	byName map[string]*Template
	// failed holds operator files that could not be loaded, by name: asking
	// for such a template gives its error rather than a bundled fallback.
	failed  map[string]error
	loaded  []LoadedTemplate
	dirName string
	hasDir  bool
}

// LoadedTemplate describes one template of a Registry, for the start-up log.
type LoadedTemplate struct {
	Name   string
	Source string
	SHA256 string
	// Overrides is set when an operator file replaces a bundled template.
	Overrides bool
}

// LoadRegistry reads every bundled template and every operator template in
// dir: files named <slug>.yaml or <slug>.yml among names (the directory's
// entries, listed by the caller), .yaml winning over .yml. dir may be nil for
// none. A file that fails to parse is kept as an error for its name and
// reported in the returned error list; it never falls back to the bundled
// template of the same name.
func LoadRegistry(dir fs.FS, dirName string, names []string) (*Registry, []error) {
	r := &Registry{byName: map[string]*Template{}, failed: map[string]error{}, dirName: dirName, hasDir: dir != nil}
	var errs []error
	bundled := map[string]bool{}
	for _, b := range BundledNames() {
		data, err := bundledFS.ReadFile("templates/" + b + ".yaml")
		if err != nil {
			errs = append(errs, fmt.Errorf("bundled template %s: %w", b, err))
			continue
		}
		t, err := ParseTemplate("bundled:"+b, data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		bundled[b] = true
		r.byName[b] = t
		r.loaded = append(r.loaded, LoadedTemplate{Name: b, Source: "bundled:" + b, SHA256: digest(data)})
	}
	if dir != nil {
		files := map[string]string{}
		for _, n := range names {
			for _, ext := range []string{".yaml", ".yml"} {
				base, ok := strings.CutSuffix(n, ext)
				if !ok || !IsSlug(base) {
					continue
				}
				if prev, seen := files[base]; !seen || (ext == ".yaml" && strings.HasSuffix(prev, ".yml")) {
					files[base] = n
				}
			}
		}
		bases := make([]string, 0, len(files))
		for b := range files {
			bases = append(bases, b)
		}
		sort.Strings(bases)
		for _, base := range bases {
			file := files[base]
			src := file
			if dirName != "" {
				src = strings.TrimSuffix(dirName, "/") + "/" + file
			}
			data, err := readBounded(dir, file)
			if err == nil && int64(len(data)) > MaxTemplateBytes {
				err = fmt.Errorf("larger than %d bytes", MaxTemplateBytes)
			}
			if err != nil {
				err = fmt.Errorf("reading template %s: %w", src, err)
				r.failed[base] = err
				delete(r.byName, base)
				errs = append(errs, err)
				continue
			}
			t, err := ParseTemplate(src, data)
			if err != nil {
				r.failed[base] = err
				delete(r.byName, base)
				errs = append(errs, err)
				continue
			}
			r.byName[base] = t
			r.loaded = append(r.loaded, LoadedTemplate{Name: base, Source: src, SHA256: digest(data), Overrides: bundled[base]})
		}
	}
	return r, errs
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Resolve returns the template with the given bare-slug name.
func (r *Registry) Resolve(name string) (*Template, error) {
	if !IsSlug(name) {
		return nil, fmt.Errorf("template name %q is not a bare slug ([A-Za-z0-9_-]+)", name)
	}
	if err, ok := r.failed[name]; ok {
		return nil, err
	}
	if t, ok := r.byName[name]; ok {
		return t, nil
	}
	where := "among the bundled templates"
	if r.hasDir {
		where = "in the templates directory (as it was when the server started or was last reloaded) or among the bundled templates"
	}
	return nil, fmt.Errorf("%w: %q is not %s (bundled: %s)", ErrTemplateNotFound, name, where, strings.Join(BundledNames(), ", "))
}

// Loaded lists the registry's templates with their sources and digests.
func (r *Registry) Loaded() []LoadedTemplate { return append([]LoadedTemplate(nil), r.loaded...) }

// Overrides reports whether an operator file replaces the bundled template.
func (r *Registry) Overrides(name string) bool {
	for _, l := range r.loaded {
		if l.Name == name && l.Overrides {
			return true
		}
	}
	return false
}

// TemplateSource resolves template names; a Registry and a Resolver both are.
type TemplateSource interface {
	Resolve(name string) (*Template, error)
}

// TemplateSet holds the current Registry and swaps it whole on Reload, so a
// caller sees either the old set or the new one, never a mixture.
type TemplateSet struct {
	cur  atomic.Pointer[Registry]
	load func() (*Registry, []error)
}

// NewTemplateSet loads a registry with load and keeps load for Reload.
func NewTemplateSet(load func() (*Registry, []error)) (*TemplateSet, []error) {
	s := &TemplateSet{load: load}
	r, errs := load()
	if r == nil {
		return nil, append(errs, errors.New("no templates could be loaded"))
	}
	s.cur.Store(r)
	return s, errs
}

// Current is the registry in force.
func (s *TemplateSet) Current() *Registry { return s.cur.Load() }

// Resolve resolves name in the current registry.
func (s *TemplateSet) Resolve(name string) (*Template, error) { return s.Current().Resolve(name) }

// Reload reads the templates again and puts the new registry in force. The
// caller logs what changed; check, when set, may refuse the new registry
// (the old one then stays).
func (s *TemplateSet) Reload(check func(*Registry) error) (*Registry, []error) {
	r, errs := s.load()
	if r == nil {
		return nil, append(errs, errors.New("no templates could be loaded; the previous set stays in force"))
	}
	if check != nil {
		if err := check(r); err != nil {
			return nil, append(errs, fmt.Errorf("%w; the previous set stays in force", err))
		}
	}
	s.cur.Store(r)
	return r, errs
}

// Overrides reports whether, in the current registry, an operator file
// replaces the bundled template of that name.
func (s *TemplateSet) Overrides(name string) bool { return s.Current().Overrides(name) }
