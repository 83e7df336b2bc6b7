package reviewlog

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"unicode"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// Reviewers are the trusted reviewers: reviewer id → public key. A human
// decision counts only when its receipt is signed by the key listed here
// for the receipt's reviewer. The file lives outside the Trace root, so
// whoever can write the volume cannot add a reviewer.
type Reviewers map[string]ed25519.PublicKey

const maxReviewersFile = 1 << 20

// LoadReviewers reads a trusted reviewers file: {"<id>": "<base64 SPKI>"}.
// Duplicate ids, bad ids and keys that do not decode are refused by name.
func LoadReviewers(path string) (Reviewers, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trusted reviewers file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxReviewersFile+1))
	if err != nil {
		return nil, fmt.Errorf("trusted reviewers file %s: %w", path, err)
	}
	if len(data) > maxReviewersFile {
		return nil, fmt.Errorf("trusted reviewers file %s is larger than %d bytes", path, maxReviewersFile)
	}
	return ParseReviewers(data, path)
}

// ParseReviewers parses the text of a trusted reviewers file.
func ParseReviewers(data []byte, name string) (Reviewers, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("trusted reviewers file %s must be a JSON object {\"<reviewer id>\": \"<base64 SPKI>\"}", name)
	}
	out := Reviewers{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("trusted reviewers file %s is not valid JSON: %s", name, plainJSONError(err))
		}
		id, _ := tok.(string)
		var b64 string
		if err := dec.Decode(&b64); err != nil {
			return nil, fmt.Errorf("trusted reviewers file %s: the key of %q must be a base64 SPKI string", name, clip(id))
		}
		if err := CheckReviewerID(id); err != nil {
			return nil, fmt.Errorf("trusted reviewers file %s: %w", name, err)
		}
		if _, dup := out[id]; dup {
			return nil, fmt.Errorf("trusted reviewers file %s lists %q twice", name, id)
		}
		pub, err := noa.DecodeSPKI(b64)
		if err != nil {
			return nil, fmt.Errorf("trusted reviewers file %s: the key of %q: %w", name, id, err)
		}
		out[id] = pub
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("trusted reviewers file %s is not valid JSON: %s", name, plainJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("trusted reviewers file %s has data after the closing brace", name)
	}
	return out, nil
}

// CheckReviewerID accepts 1..128 printable characters with no white space.
func CheckReviewerID(id string) error {
	if id == "" || len(id) > 128 {
		return fmt.Errorf("%w: a reviewer id is 1 to 128 characters (got %d)", ErrBadInput, len(id))
	}
	for _, r := range id {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) || r == unicode.ReplacementChar {
			return fmt.Errorf("%w: reviewer id %q contains white space or a character that does not print", ErrBadInput, clip(id))
		}
	}
	return nil
}

// IDOf returns the reviewer id whose key is pub, if any.
func (rs Reviewers) IDOf(pub ed25519.PublicKey) (string, bool) {
	for id, k := range rs {
		if k.Equal(pub) {
			return id, true
		}
	}
	return "", false
}

// AddReviewer adds id → pub to the trusted reviewers file at path (created
// 0600, its directory 0700, when absent), written whole and renamed into
// place. An id already listed with another key is refused; with the same
// key it is a no-op.
func AddReviewer(path, id string, pub ed25519.PublicKey) (added bool, err error) {
	if err := CheckReviewerID(id); err != nil {
		return false, err
	}
	rs := Reviewers{}
	switch existing, err := LoadReviewers(path); {
	case err == nil:
		rs = existing
	case errors.Is(err, os.ErrNotExist):
	default:
		return false, err
	}
	if k, ok := rs[id]; ok {
		if k.Equal(pub) {
			return false, nil
		}
		return false, fmt.Errorf("%w: %s already lists reviewer %q with another key; remove that entry first if the key really changed", ErrBadInput, path, id)
	}
	if other, ok := rs.IDOf(pub); ok {
		return false, fmt.Errorf("%w: %s already lists this key as reviewer %q; one key is one reviewer", ErrBadInput, path, other)
	}
	rs[id] = pub
	ids := make([]string, 0, len(rs))
	for k := range rs {
		ids = append(ids, k)
	}
	sort.Strings(ids)
	var buf bytes.Buffer
	buf.WriteString("{\n")
	for i, k := range ids {
		kb, _ := json.Marshal(k)
		fmt.Fprintf(&buf, "  %s: %q", kb, noa.EncodeSPKI(rs[k]))
		if i < len(ids)-1 {
			buf.WriteByte(',')
		}
		buf.WriteByte('\n')
	}
	buf.WriteString("}\n")
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, fmt.Errorf("create %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, ".reviewers-*.json")
	if err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	return true, nil
}
