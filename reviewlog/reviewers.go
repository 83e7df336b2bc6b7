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
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

// Reviewers are the trusted reviewers: reviewer id → public key. A human
// decision counts only when its receipt is signed by the key listed here
// for the receipt's reviewer. The file lives outside the Trace root, so
// whoever can write the volume cannot add a reviewer.
type Reviewers map[string]ed25519.PublicKey

const maxReviewersFile = 1 << 20

// Passkeys are the trusted reviewers' passkeys: reviewer id → the
// credentials the operator enrolled for them. A decision a passkey made
// counts only when its assertion verifies under a credential listed here
// for the receipt's reviewer.
type Passkeys map[string][]passkey.Credential

// Find returns reviewer's credential whose id is credID.
func (p Passkeys) Find(reviewer, credID string) (passkey.Credential, bool) {
	for _, c := range p[reviewer] {
		if c.ID == credID {
			return c, true
		}
	}
	return passkey.Credential{}, false
}

// Owner returns the reviewer who holds credential credID.
func (p Passkeys) Owner(credID string) (string, passkey.Credential, bool) {
	for id, cs := range p {
		for _, c := range cs {
			if c.ID == credID {
				return id, c, true
			}
		}
	}
	return "", passkey.Credential{}, false
}

// LoadReviewers reads a trusted reviewers file's Ed25519 keys (see
// ParseTrust for the format).
func LoadReviewers(path string) (Reviewers, error) {
	rs, _, err := LoadTrust(path)
	return rs, err
}

// LoadPasskeys reads a trusted reviewers file's passkeys.
func LoadPasskeys(path string) (Passkeys, error) {
	_, pk, err := LoadTrust(path)
	return pk, err
}

// LoadTrust reads a trusted reviewers file whole.
func LoadTrust(path string) (Reviewers, Passkeys, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("trusted reviewers file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxReviewersFile+1))
	if err != nil {
		return nil, nil, fmt.Errorf("trusted reviewers file %s: %w", path, err)
	}
	if len(data) > maxReviewersFile {
		return nil, nil, fmt.Errorf("trusted reviewers file %s is larger than %d bytes", path, maxReviewersFile)
	}
	return ParseTrust(data, path)
}

// ParseReviewers parses the Ed25519 keys of a trusted reviewers file.
func ParseReviewers(data []byte, name string) (Reviewers, error) {
	rs, _, err := ParseTrust(data, name)
	return rs, err
}

// trustEntry is a reviewer written as an object: an Ed25519 key, passkeys,
// or both.
type trustEntry struct {
	Key      string               `json:"key,omitempty"`
	Passkeys []passkey.Credential `json:"passkeys,omitempty"`
}

// ParseTrust parses the text of a trusted reviewers file:
//
//	{"<id>": "<base64 SPKI>", "<id>": {"key": "<base64 SPKI>", "passkeys": [{"credential_id", "public_key", "rp_id", "origin"}]}}
//
// Duplicate ids, bad ids, keys that do not decode, a credential listed
// twice and unknown members are refused by name.
func ParseTrust(data []byte, name string) (Reviewers, Passkeys, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, nil, fmt.Errorf("trusted reviewers file %s must be a JSON object {\"<reviewer id>\": \"<base64 SPKI>\"}", name)
	}
	out, pks := Reviewers{}, Passkeys{}
	seen := map[string]bool{}
	creds := map[string]string{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, fmt.Errorf("trusted reviewers file %s is not valid JSON: %s", name, plainJSONError(err))
		}
		id, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, fmt.Errorf("trusted reviewers file %s is not valid JSON: %s", name, plainJSONError(err))
		}
		if err := CheckReviewerID(id); err != nil {
			return nil, nil, fmt.Errorf("trusted reviewers file %s: %w", name, err)
		}
		if seen[id] {
			return nil, nil, fmt.Errorf("trusted reviewers file %s lists %q twice", name, id)
		}
		seen[id] = true
		var e trustEntry
		if err := json.Unmarshal(raw, &e.Key); err != nil {
			inner := json.NewDecoder(bytes.NewReader(raw))
			inner.DisallowUnknownFields()
			e = trustEntry{}
			if err := inner.Decode(&e); err != nil {
				return nil, nil, fmt.Errorf("trusted reviewers file %s: the entry of %q must be a base64 SPKI string or {\"key\", \"passkeys\"} (%s)", name, clip(id), plainJSONError(err))
			}
			if e.Key == "" && len(e.Passkeys) == 0 {
				return nil, nil, fmt.Errorf("trusted reviewers file %s: the entry of %q has neither a key nor a passkey", name, clip(id))
			}
		}
		if e.Key != "" {
			pub, err := noa.DecodeSPKI(e.Key)
			if err != nil {
				return nil, nil, fmt.Errorf("trusted reviewers file %s: the key of %q: %w", name, id, err)
			}
			out[id] = pub
		}
		for i, c := range e.Passkeys {
			if err := c.Check(); err != nil {
				return nil, nil, fmt.Errorf("trusted reviewers file %s: passkey %d of %q: %w", name, i+1, clip(id), err)
			}
			if other, dup := creds[c.ID]; dup {
				return nil, nil, fmt.Errorf("trusted reviewers file %s lists passkey %s twice (for %q and %q)", name, clip(c.ID), clip(other), clip(id))
			}
			creds[c.ID] = id
			pks[id] = append(pks[id], c)
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, fmt.Errorf("trusted reviewers file %s is not valid JSON: %s", name, plainJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, fmt.Errorf("trusted reviewers file %s has data after the closing brace", name)
	}
	return out, pks, nil
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
// place; the passkeys the file lists are kept. An id already listed with
// another key is refused; with the same key it is a no-op.
func AddReviewer(path, id string, pub ed25519.PublicKey) (added bool, err error) {
	if err := CheckReviewerID(id); err != nil {
		return false, err
	}
	rs, pks, err := loadTrustOrEmpty(path)
	if err != nil {
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
	return true, writeTrust(path, rs, pks)
}

// AddPasskey adds credential c to reviewer id in the trusted reviewers file
// at path (beside the reviewer's key, if any). Only the operator's command
// calls it; the server never writes the file. The same credential already
// listed for id is a no-op; listed for another reviewer, it is refused.
func AddPasskey(path, id string, c passkey.Credential) (added bool, err error) {
	if err := CheckReviewerID(id); err != nil {
		return false, err
	}
	if err := c.Check(); err != nil {
		return false, err
	}
	rs, pks, err := loadTrustOrEmpty(path)
	if err != nil {
		return false, err
	}
	if owner, have, ok := pks.Owner(c.ID); ok {
		if owner == id && have == c {
			return false, nil
		}
		return false, fmt.Errorf("%w: %s already lists passkey %s for reviewer %q", ErrBadInput, path, clip(c.ID), owner)
	}
	pks[id] = append(pks[id], c)
	return true, writeTrust(path, rs, pks)
}

// RemovePasskeys removes reviewer id's passkeys from the file at path: the
// one whose credential id is credID, or every one when credID is "". It
// returns how many it removed.
func RemovePasskeys(path, id, credID string) (int, error) {
	rs, pks, err := LoadTrust(path)
	if err != nil {
		return 0, err
	}
	var kept []passkey.Credential
	for _, c := range pks[id] {
		if credID != "" && c.ID != credID {
			kept = append(kept, c)
		}
	}
	n := len(pks[id]) - len(kept)
	if n == 0 {
		return 0, nil
	}
	if len(kept) == 0 {
		delete(pks, id)
	} else {
		pks[id] = kept
	}
	return n, writeTrust(path, rs, pks)
}

func loadTrustOrEmpty(path string) (Reviewers, Passkeys, error) {
	rs, pks, err := LoadTrust(path)
	switch {
	case err == nil:
		return rs, pks, nil
	case errors.Is(err, os.ErrNotExist):
		return Reviewers{}, Passkeys{}, nil
	default:
		return nil, nil, err
	}
}

// writeTrust writes the whole trusted reviewers file and renames it into
// place: a reviewer with a key alone as a string, any other as an object.
func writeTrust(path string, rs Reviewers, pks Passkeys) error {
	idset := map[string]bool{}
	for k := range rs {
		idset[k] = true
	}
	for k := range pks {
		idset[k] = true
	}
	ids := make([]string, 0, len(idset))
	for k := range idset {
		ids = append(ids, k)
	}
	sort.Strings(ids)
	var buf bytes.Buffer
	buf.WriteString("{\n")
	for i, k := range ids {
		kb, _ := json.Marshal(k)
		if len(pks[k]) == 0 {
			fmt.Fprintf(&buf, "  %s: %q", kb, noa.EncodeSPKI(rs[k]))
		} else {
			e := trustEntry{Passkeys: pks[k]}
			if pub, ok := rs[k]; ok {
				e.Key = noa.EncodeSPKI(pub)
			}
			eb, err := json.Marshal(e)
			if err != nil {
				return fmt.Errorf("write %s: %w", path, err)
			}
			fmt.Fprintf(&buf, "  %s: %s", kb, eb)
		}
		if i < len(ids)-1 {
			buf.WriteByte(',')
		}
		buf.WriteByte('\n')
	}
	buf.WriteString("}\n")
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, ".reviewers-*.json")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
