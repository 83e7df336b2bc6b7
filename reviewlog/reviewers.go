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

// Grants are the tenants each reviewer may decide for when the server
// serves several (--tenants-dir): reviewer id → tenant slugs, or AllTenants.
// A reviewer absent here decides for no tenant; a single-root server reads
// no grant (every trusted reviewer decides there).
type Grants map[string][]string

// AllTenants, in a reviewer's "tenants", grants every tenant.
const AllTenants = "*"

// Allows reports whether reviewer may decide for tenant: the file grants
// them tenant by name, or every tenant ("*").
func (g Grants) Allows(reviewer, tenant string) bool {
	for _, t := range g[reviewer] {
		if t == tenant || t == AllTenants {
			return true
		}
	}
	return false
}

// LoadGrants reads a trusted reviewers file's tenant grants.
func LoadGrants(path string) (Grants, error) {
	t, err := loadTrustFile(path)
	return t.grants, err
}

// LoadTenantPasskeys reads the passkeys of the reviewers the file grants
// tenant, from one reading of the file: the only passkeys a tenant's
// console trusts. A reviewer granted no tenant has none there.
func LoadTenantPasskeys(path, tenant string) (Passkeys, error) {
	t, err := loadTrustFile(path)
	if err != nil {
		return nil, err
	}
	out := Passkeys{}
	for id, cs := range t.passkeys {
		if t.grants.Allows(id, tenant) {
			out[id] = cs
		}
	}
	return out, nil
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

// LoadTrust reads a trusted reviewers file's keys and passkeys.
func LoadTrust(path string) (Reviewers, Passkeys, error) {
	t, err := loadTrustFile(path)
	return t.keys, t.passkeys, err
}

// ReviewerTrust is a trusted reviewers file whole, held to a tenant or not:
// what a HUMAN receipt is checked against outside a running server
// (`verify --reviewers`).
type ReviewerTrust struct {
	Reviewers Reviewers
	Passkeys  Passkeys
	Grants    Grants
	// Tenant, when set, is the tenant of a --tenants-dir server: a
	// decision counts only by a reviewer Grants allows it.
	Tenant string
	// ServerKeys is the server's keyring, which seals the receipt of a
	// decision a passkey made; without it such a decision does not count.
	ServerKeys noa.Keyring
}

// LoadReviewerTrust reads a trusted reviewers file once: keys, passkeys
// and grants, held to tenant ("" for a single root's reading).
func LoadReviewerTrust(path, tenant string) (ReviewerTrust, error) {
	t, err := loadTrustFile(path)
	if err != nil {
		return ReviewerTrust{}, err
	}
	return ReviewerTrust{Reviewers: t.keys, Passkeys: t.passkeys, Grants: t.grants, Tenant: tenant}, nil
}

// DecisionProblem says why a HUMAN receipt is no decision of a reviewer t
// trusts (and, with t.Tenant, grants that tenant): "" when it is one. It
// is the check the guard holds every decision to; which review's terms the
// receipt decides is not checked here (that needs the review log).
func (t ReviewerTrust) DecisionProblem(rc noa.Receipt) string {
	ts := trustSet{reviewers: t.Reviewers, passkeys: t.Passkeys, tenant: t.Tenant, grants: t.Grants}
	if t.ServerKeys != nil {
		ts.server = func(string) (noa.Keyring, error) { return t.ServerKeys, nil }
	}
	return humanProblem(rc, ts)
}

// trustFile is a trusted reviewers file whole.
type trustFile struct {
	keys     Reviewers
	passkeys Passkeys
	grants   Grants
}

func loadTrustFile(path string) (trustFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return trustFile{}, fmt.Errorf("trusted reviewers file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxReviewersFile+1))
	if err != nil {
		return trustFile{}, fmt.Errorf("trusted reviewers file %s: %w", path, err)
	}
	if len(data) > maxReviewersFile {
		return trustFile{}, fmt.Errorf("trusted reviewers file %s is larger than %d bytes", path, maxReviewersFile)
	}
	return parseTrustFile(data, path)
}

// ParseReviewers parses the Ed25519 keys of a trusted reviewers file.
func ParseReviewers(data []byte, name string) (Reviewers, error) {
	rs, _, err := ParseTrust(data, name)
	return rs, err
}

// trustEntry is a reviewer written as an object: an Ed25519 key, passkeys,
// or both, and the tenants they may decide for.
type trustEntry struct {
	Key      string               `json:"key,omitempty"`
	Passkeys []passkey.Credential `json:"passkeys,omitempty"`
	Tenants  []string             `json:"tenants,omitempty"`
}

// maxGrants bounds one reviewer's tenants.
const maxGrants = 1024

// CheckTenantGrant accepts what a reviewer's "tenants" may list: a tenant
// (CheckTenant), or AllTenants ("*", every tenant).
func CheckTenantGrant(t string) error {
	if t == AllTenants {
		return nil
	}
	if err := CheckTenant(t); err != nil {
		return fmt.Errorf("%w, or \"*\" for every tenant", err)
	}
	return nil
}

// CheckTenant accepts a tenant slug as --tenants-dir names tenants: 1..64
// of [A-Za-z0-9_-].
func CheckTenant(t string) error {
	if t == "" || len(t) > 64 {
		return fmt.Errorf("%w: a tenant is 1 to 64 of [A-Za-z0-9_-] (got %d bytes)", ErrBadInput, len(t))
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return fmt.Errorf("%w: tenant %q: a tenant is 1 to 64 of [A-Za-z0-9_-]", ErrBadInput, clip(t))
		}
	}
	return nil
}

// ParseTrust parses the text of a trusted reviewers file:
//
//	{"<id>": "<base64 SPKI>", "<id>": {"key": "<base64 SPKI>", "passkeys": [{"credential_id", "public_key", "rp_id", "origin"}], "tenants": ["<tenant>"]}}
//
// Duplicate ids, bad ids, keys that do not decode, a credential listed
// twice, a bad or repeated tenant and unknown members are refused by name.
func ParseTrust(data []byte, name string) (Reviewers, Passkeys, error) {
	t, err := parseTrustFile(data, name)
	return t.keys, t.passkeys, err
}

func parseTrustFile(data []byte, name string) (trustFile, error) {
	rs, pks, gs, err := parseTrust(data, name)
	if err != nil {
		return trustFile{}, err
	}
	return trustFile{keys: rs, passkeys: pks, grants: gs}, nil
}

func parseTrust(data []byte, name string) (Reviewers, Passkeys, Grants, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, nil, nil, fmt.Errorf("trusted reviewers file %s must be a JSON object {\"<reviewer id>\": \"<base64 SPKI>\"}", name)
	}
	out, pks, gs := Reviewers{}, Passkeys{}, Grants{}
	seen := map[string]bool{}
	creds := map[string]string{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("trusted reviewers file %s is not valid JSON: %s", name, plainJSONError(err))
		}
		id, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, nil, fmt.Errorf("trusted reviewers file %s is not valid JSON: %s", name, plainJSONError(err))
		}
		if err := CheckReviewerID(id); err != nil {
			return nil, nil, nil, fmt.Errorf("trusted reviewers file %s: %w", name, err)
		}
		if seen[id] {
			return nil, nil, nil, fmt.Errorf("trusted reviewers file %s lists %q twice", name, id)
		}
		seen[id] = true
		var e trustEntry
		if err := json.Unmarshal(raw, &e.Key); err != nil {
			inner := json.NewDecoder(bytes.NewReader(raw))
			inner.DisallowUnknownFields()
			e = trustEntry{}
			if err := inner.Decode(&e); err != nil {
				return nil, nil, nil, fmt.Errorf("trusted reviewers file %s: the entry of %q must be a base64 SPKI string or {\"key\", \"passkeys\", \"tenants\"} (%s)", name, clip(id), plainJSONError(err))
			}
			if e.Key == "" && len(e.Passkeys) == 0 {
				return nil, nil, nil, fmt.Errorf("trusted reviewers file %s: the entry of %q has neither a key nor a passkey", name, clip(id))
			}
		}
		if e.Key != "" {
			pub, err := noa.DecodeSPKI(e.Key)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("trusted reviewers file %s: the key of %q: %w", name, id, err)
			}
			out[id] = pub
		}
		for i, c := range e.Passkeys {
			if err := c.Check(); err != nil {
				return nil, nil, nil, fmt.Errorf("trusted reviewers file %s: passkey %d of %q: %w", name, i+1, clip(id), err)
			}
			if other, dup := creds[c.ID]; dup {
				return nil, nil, nil, fmt.Errorf("trusted reviewers file %s lists passkey %s twice (for %q and %q)", name, clip(c.ID), clip(other), clip(id))
			}
			creds[c.ID] = id
			pks[id] = append(pks[id], c)
		}
		if len(e.Tenants) > maxGrants {
			return nil, nil, nil, fmt.Errorf("trusted reviewers file %s: %q is granted more than %d tenants", name, clip(id), maxGrants)
		}
		granted := map[string]bool{}
		for _, t := range e.Tenants {
			if err := CheckTenantGrant(t); err != nil {
				return nil, nil, nil, fmt.Errorf("trusted reviewers file %s: the tenants of %q: %w", name, clip(id), err)
			}
			if granted[t] {
				return nil, nil, nil, fmt.Errorf("trusted reviewers file %s: the tenants of %q list %q twice", name, clip(id), t)
			}
			granted[t] = true
			gs[id] = append(gs[id], t)
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, nil, fmt.Errorf("trusted reviewers file %s is not valid JSON: %s", name, plainJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, nil, fmt.Errorf("trusted reviewers file %s has data after the closing brace", name)
	}
	return out, pks, gs, nil
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
// place; the passkeys and tenant grants the file lists are kept, and id is
// granted tenants besides those it has. An id already listed with another
// key is refused; with the same key and no new tenant it is a no-op.
// changed reports whether the file was written.
func AddReviewer(path, id string, pub ed25519.PublicKey, tenants ...string) (changed bool, err error) {
	if err := CheckReviewerID(id); err != nil {
		return false, err
	}
	t, err := loadTrustOrEmpty(path)
	if err != nil {
		return false, err
	}
	if k, ok := t.keys[id]; ok {
		if !k.Equal(pub) {
			return false, fmt.Errorf("%w: %s already lists reviewer %q with another key; remove that entry first if the key really changed", ErrBadInput, path, id)
		}
	} else {
		if other, ok := t.keys.IDOf(pub); ok {
			return false, fmt.Errorf("%w: %s already lists this key as reviewer %q; one key is one reviewer", ErrBadInput, path, other)
		}
		t.keys[id] = pub
		changed = true
	}
	granted, err := t.grant(id, tenants)
	if err != nil {
		return false, err
	}
	if !changed && !granted {
		return false, nil
	}
	return true, writeTrust(path, t)
}

// grant adds tenants to id's grants; it reports whether any was new.
func (t *trustFile) grant(id string, tenants []string) (bool, error) {
	added := false
	for _, tn := range tenants {
		if err := CheckTenantGrant(tn); err != nil {
			return false, err
		}
		if t.grants.Allows(id, tn) {
			continue
		}
		if len(t.grants[id]) >= maxGrants {
			return false, fmt.Errorf("%w: reviewer %q would be granted more than %d tenants", ErrBadInput, clip(id), maxGrants)
		}
		t.grants[id] = append(t.grants[id], tn)
		added = true
	}
	return added, nil
}

// AddPasskey adds credential c to reviewer id in the trusted reviewers file
// at path (beside the reviewer's key, if any). Only the operator's command
// calls it; the server never writes the file. The same credential already
// listed for id (and no new tenant) is a no-op; listed for another
// reviewer, it is refused. id is granted tenants besides those it has; the
// file's other entries and grants are kept.
func AddPasskey(path, id string, c passkey.Credential, tenants ...string) (changed bool, err error) {
	if err := CheckReviewerID(id); err != nil {
		return false, err
	}
	if err := c.Check(); err != nil {
		return false, err
	}
	t, err := loadTrustOrEmpty(path)
	if err != nil {
		return false, err
	}
	if owner, have, ok := t.passkeys.Owner(c.ID); ok {
		if owner != id || have != c {
			return false, fmt.Errorf("%w: %s already lists passkey %s for reviewer %q", ErrBadInput, path, clip(c.ID), owner)
		}
	} else {
		t.passkeys[id] = append(t.passkeys[id], c)
		changed = true
	}
	granted, err := t.grant(id, tenants)
	if err != nil {
		return false, err
	}
	if !changed && !granted {
		return false, nil
	}
	return true, writeTrust(path, t)
}

// CheckAddPasskey reports what would stop AddPasskey from adding a passkey
// of reviewer id, with these tenant grants, to the file at path — short of
// the credential itself: an id or a grant it refuses, a file that does not
// read, a directory where the file cannot be written. Nothing it writes
// stays. The operator's command asks it before it issues an enrolment
// link, so that no reviewer registers a passkey that cannot be trusted.
func CheckAddPasskey(path, id string, tenants ...string) error {
	if err := CheckReviewerID(id); err != nil {
		return err
	}
	t, err := loadTrustOrEmpty(path)
	if err != nil {
		return err
	}
	if _, err := t.grant(id, tenants); err != nil {
		return err
	}
	// writeTrust creates the directory and renames a file into it: the
	// nearest directory that exists must take a new file.
	dir := filepath.Dir(path)
	for {
		st, err := os.Stat(dir)
		if err == nil {
			if !st.IsDir() {
				return fmt.Errorf("write %s: %s is not a directory", path, dir)
			}
			break
		}
		if !errors.Is(err, os.ErrNotExist) || filepath.Dir(dir) == dir {
			return fmt.Errorf("write %s: %w", path, err)
		}
		dir = filepath.Dir(dir)
	}
	probe, err := os.CreateTemp(dir, ".reviewers-probe-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	probe.Close()
	return os.Remove(probe.Name())
}

// RemovePasskeys removes reviewer id's passkeys from the file at path: the
// one whose credential id is credID, or every one when credID is "". It
// returns how many it removed. The reviewer's tenant grants are kept while
// the entry keeps a key or a passkey; an entry left with neither is gone,
// grants and all.
func RemovePasskeys(path, id, credID string) (int, error) {
	t, err := loadTrustFile(path)
	if err != nil {
		return 0, err
	}
	pks := t.passkeys
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
		if _, hasKey := t.keys[id]; !hasKey {
			delete(t.grants, id)
		}
	} else {
		pks[id] = kept
	}
	return n, writeTrust(path, t)
}

func loadTrustOrEmpty(path string) (trustFile, error) {
	t, err := loadTrustFile(path)
	switch {
	case err == nil:
		return t, nil
	case errors.Is(err, os.ErrNotExist):
		return trustFile{keys: Reviewers{}, passkeys: Passkeys{}, grants: Grants{}}, nil
	default:
		return trustFile{}, err
	}
}

// writeTrust writes the whole trusted reviewers file and renames it into
// place: a reviewer with a key alone as a string, any other (passkeys or
// tenant grants) as an object.
func writeTrust(path string, t trustFile) error {
	rs, pks, gs := t.keys, t.passkeys, t.grants
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
		if len(pks[k]) == 0 && len(gs[k]) == 0 {
			fmt.Fprintf(&buf, "  %s: %q", kb, noa.EncodeSPKI(rs[k]))
		} else {
			e := trustEntry{Passkeys: pks[k], Tenants: gs[k]}
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
