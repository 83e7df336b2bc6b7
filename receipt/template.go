package receipt

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// Witness is one entry of a stage's match-set: an event type, optionally
// constrained to the role that observed it.
type Witness struct {
	Event   string
	Role    string
	HasRole bool
}

// StageSpec is one milestone of a template.
type StageSpec struct {
	ID                 string
	Required           bool
	Match              []Witness
	MissingExplanation string // "" when the template gives none
}

// Template is an operation template (SPEC §3).
type Template struct {
	Name       string  // the `template` field
	Version    float64 // finite
	Stages     []StageSpec
	Exceptions []string
	Source     string // where it was loaded from, for messages
}

// MaxTemplateBytes bounds a template file; real ones are a few KiB.
const MaxTemplateBytes = 1 << 20

// maxTemplateNodes bounds the YAML nodes walked, so aliases cannot make a
// small file expand into an enormous template.
const maxTemplateNodes = 100_000

// TemplateError names the source of a broken template, the path of the
// first broken field and the rule it breaks.
type TemplateError struct {
	Source string
	Path   string // e.g. "stages[1].match[0].event"; "" for the whole file
	Rule   string
}

func (e *TemplateError) Error() string {
	if e.Path == "" {
		return e.Source + ": " + e.Rule
	}
	return e.Source + ": " + e.Path + ": " + e.Rule
}

// ParseTemplate parses and validates template YAML. source names the
// template in errors (a path, or "bundled:x402-buyer").
//
// Beyond the reference's rules it refuses unknown keys (a misspelt
// `exception:` would otherwise silently drop every fault) and an empty
// missing_explanation (which explains nothing).
func ParseTemplate(source string, data []byte) (*Template, error) {
	fail := func(path, format string, args ...any) (*Template, error) {
		return nil, &TemplateError{Source: source, Path: path, Rule: fmt.Sprintf(format, args...)}
	}
	if len(data) > MaxTemplateBytes {
		return fail("", "file is %d bytes, over the %d KiB template limit", len(data), MaxTemplateBytes>>10)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return fail("", "empty file; expected a mapping with template, version and stages")
		}
		return fail("", "not valid YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return fail("", "holds more than one YAML document; a template is exactly one")
	}
	w := walker{}
	top := w.deref(&root)
	if top.Kind == yaml.DocumentNode && len(top.Content) == 1 {
		top = w.deref(top.Content[0])
	}
	if w.err != nil {
		return fail("", "%v", w.err)
	}
	if top.Kind != yaml.MappingNode {
		return fail("", "expected a mapping at the top level, got %s", describeNode(top))
	}
	t := &Template{Source: source}
	fields, err := w.mapping(top, "template", "version", "stages", "exceptions")
	if err != nil {
		return fail(err.path, "%s", err.rule)
	}
	var ok bool
	if t.Name, ok = scalarString(fields["template"]); !ok || t.Name == "" {
		return fail("template", "must be a non-empty string")
	}
	if t.Version, ok = scalarNumber(fields["version"]); !ok {
		return fail("version", "must be a finite number")
	}
	stages := fields["stages"]
	if stages == nil || stages.Kind != yaml.SequenceNode || len(stages.Content) == 0 {
		return fail("stages", "must be a non-empty list")
	}
	seen := map[string]bool{}
	for i, sn := range stages.Content {
		at := fmt.Sprintf("stages[%d]", i)
		sn = w.deref(sn)
		if w.err != nil {
			return fail("", "%v", w.err)
		}
		if sn.Kind != yaml.MappingNode {
			return fail(at, "expected a mapping with id, required and match, got %s", describeNode(sn))
		}
		sf, err := w.mapping(sn, "id", "required", "match", "missing_explanation")
		if err != nil {
			return fail(at+"."+err.path, "%s", err.rule)
		}
		var st StageSpec
		if st.ID, ok = scalarString(sf["id"]); !ok || st.ID == "" {
			return fail(at+".id", "must be a non-empty string")
		}
		if seen[st.ID] {
			return fail(at+".id", "duplicate stage id %q", st.ID)
		}
		seen[st.ID] = true
		if st.Required, ok = scalarBool(sf["required"]); !ok {
			return fail(at+".required", "must be a boolean (true or false)")
		}
		match := sf["match"]
		if match == nil || match.Kind != yaml.SequenceNode || len(match.Content) == 0 {
			return fail(at+".match", "must be a non-empty list")
		}
		for j, mn := range match.Content {
			mat := fmt.Sprintf("%s.match[%d]", at, j)
			mn = w.deref(mn)
			if mn.Kind != yaml.MappingNode {
				return fail(mat, "expected a mapping with event and an optional role, got %s", describeNode(mn))
			}
			mf, err := w.mapping(mn, "event", "role")
			if err != nil {
				return fail(mat+"."+err.path, "%s", err.rule)
			}
			var wit Witness
			if wit.Event, ok = scalarString(mf["event"]); !ok || wit.Event == "" {
				return fail(mat+".event", "must be a non-empty string")
			}
			if rn := mf["role"]; rn != nil {
				if wit.Role, ok = scalarString(rn); !ok || wit.Role == "" {
					return fail(mat+".role", "must be a non-empty string when present")
				}
				wit.HasRole = true
			}
			st.Match = append(st.Match, wit)
		}
		if en := sf["missing_explanation"]; en != nil {
			if st.MissingExplanation, ok = scalarString(en); !ok || st.MissingExplanation == "" {
				return fail(at+".missing_explanation", "must be a non-empty string when present")
			}
		}
		t.Stages = append(t.Stages, st)
	}
	if en := fields["exceptions"]; en != nil {
		if en.Kind != yaml.SequenceNode {
			return fail("exceptions", "must be a list of non-empty strings")
		}
		for i, xn := range en.Content {
			x, ok := scalarString(w.deref(xn))
			if !ok || x == "" {
				return fail(fmt.Sprintf("exceptions[%d]", i), "must be a non-empty string")
			}
			t.Exceptions = append(t.Exceptions, x)
		}
	}
	if w.err != nil {
		return fail("", "%v", w.err)
	}
	return t, nil
}

// walker resolves aliases and counts the nodes it visits.
type walker struct {
	n   int
	err error
}

type fieldErr struct{ path, rule string }

func (w *walker) deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 100; i++ {
		n = n.Alias
	}
	w.n++
	if w.n > maxTemplateNodes && w.err == nil {
		w.err = fmt.Errorf("more than %d YAML nodes (after expanding aliases)", maxTemplateNodes)
	}
	if n == nil {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null"}
	}
	return n
}

// mapping returns the values of a mapping by key, refusing keys not listed.
func (w *walker) mapping(n *yaml.Node, allowed ...string) (map[string]*yaml.Node, *fieldErr) {
	out := make(map[string]*yaml.Node, len(allowed))
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := w.deref(n.Content[i])
		key, ok := scalarString(k)
		if !ok {
			return nil, &fieldErr{"", fmt.Sprintf("keys must be strings, got %s", describeNode(k))}
		}
		known := false
		for _, a := range allowed {
			known = known || a == key
		}
		if !known {
			return nil, &fieldErr{key, fmt.Sprintf("unknown key (expected one of %s)", strings.Join(allowed, ", "))}
		}
		if _, dup := out[key]; dup {
			return nil, &fieldErr{key, "duplicate key"}
		}
		// An explicit null is kept as a node: it is a wrong value, not an
		// absent one.
		out[key] = w.deref(n.Content[i+1])
	}
	return out, nil
}

func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return "a " + strings.TrimPrefix(n.ShortTag(), "!!")
	}
	return "nothing"
}

func scalarString(n *yaml.Node) (string, bool) {
	if n == nil || n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		return "", false
	}
	return n.Value, true
}

func scalarBool(n *yaml.Node) (bool, bool) {
	if n == nil || n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
		return false, false
	}
	var b bool
	if err := n.Decode(&b); err != nil {
		return false, false
	}
	return b, true
}

func scalarNumber(n *yaml.Node) (float64, bool) {
	if n == nil || n.Kind != yaml.ScalarNode {
		return 0, false
	}
	if tag := n.ShortTag(); tag != "!!int" && tag != "!!float" {
		return 0, false
	}
	var f float64
	if err := n.Decode(&f); err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// LoadTemplateFile reads and parses a template file.
func LoadTemplateFile(path string) (*Template, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxTemplateBytes+1))
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", path, err)
	}
	return ParseTemplate(path, data)
}

// IsSlug reports whether s is a bare template name: [A-Za-z0-9_-]+.
func IsSlug(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

//go:embed templates/*.yaml
var bundledFS embed.FS

// BundledNames lists the templates embedded in the binary.
func BundledNames() []string {
	return []string{"escrow-arc", "x402-buyer", "x402-facilitator", "x402-seller"}
}

// Bundled parses one embedded template by name.
func Bundled(name string) (*Template, error) {
	if !IsSlug(name) {
		return nil, fmt.Errorf("template name %q is not a bare slug ([A-Za-z0-9_-]+)", name)
	}
	data, err := bundledFS.ReadFile("templates/" + name + ".yaml")
	if err != nil {
		return nil, fmt.Errorf("no bundled template named %q (bundled: %s)", name, strings.Join(BundledNames(), ", "))
	}
	return ParseTemplate("bundled:"+name, data)
}

// ErrTemplateNotFound is wrapped by Resolve when no template has the name.
var ErrTemplateNotFound = errors.New("template not found")

// Resolver finds templates by name: the operator's directory first, then the
// bundled ones.
type Resolver struct {
	// Dir is the operator's templates directory, or nil for none. The caller
	// supplies an fs.FS that already refuses symbolic links.
	Dir fs.FS
	// DirName names Dir in messages (e.g. ".trace/templates").
	DirName string
}

// Resolve returns the template with the given bare-slug name: Dir/<name>.yaml,
// then Dir/<name>.yml, then the bundled template.
func (r Resolver) Resolve(name string) (*Template, error) {
	if !IsSlug(name) {
		return nil, fmt.Errorf("template name %q is not a bare slug ([A-Za-z0-9_-]+)", name)
	}
	if r.Dir != nil {
		for _, ext := range []string{".yaml", ".yml"} {
			file := name + ext
			data, err := readBounded(r.Dir, file)
			if err == nil {
				src := file
				if r.DirName != "" {
					src = strings.TrimSuffix(r.DirName, "/") + "/" + file
				}
				return ParseTemplate(src, data)
			}
			if !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("reading template %s: %w", file, err)
			}
		}
	}
	for _, b := range BundledNames() {
		if b == name {
			return Bundled(name)
		}
	}
	where := "among the bundled templates"
	if r.Dir != nil {
		where = "in the templates directory or among the bundled templates"
	}
	return nil, fmt.Errorf("%w: %q is not %s (bundled: %s)", ErrTemplateNotFound, name, where, strings.Join(BundledNames(), ", "))
}

func readBounded(fsys fs.FS, name string) ([]byte, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, MaxTemplateBytes+1))
}
