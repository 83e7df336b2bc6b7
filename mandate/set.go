package mandate

import (
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"math/big"
	"sort"
	"sync"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

// Trust is who may sign a tenant's mandates: the trusted reviewers' keys
// and passkeys, and, for a server that serves several tenants, whether the
// trusted reviewers file grants a reviewer this one.
type Trust struct {
	Keys map[string]ed25519.PublicKey
	// Passkeys are the trusted reviewers' passkeys, by reviewer id.
	Passkeys map[string][]passkey.Credential
	// Granted, when set, says whether a reviewer may decide for the
	// tenant; nil: every trusted reviewer may (a single root).
	Granted func(reviewer string) bool
}

// signerProblem says why a record's signer is not trusted ("" when it is).
func (t Trust) signerProblem(r *Record, cache *Cache, line []byte) string {
	if r.SignedWithPasskey() {
		return t.passkeyProblem(r, cache, line)
	}
	pub, ok := t.Keys[r.By]
	switch {
	case !ok:
		return fmt.Sprintf("reviewer %q is not in the trusted reviewers file", clip(r.By))
	case noa.KeyID(pub) != r.KID:
		return fmt.Sprintf("it names key %s, not reviewer %q's trusted key", clip(r.KID), clip(r.By))
	case t.Granted != nil && !t.Granted(r.By):
		return fmt.Sprintf("reviewer %q is trusted, but not granted this tenant", clip(r.By))
	}
	if !cache.verified(pub, line, func() error { return r.Verify(pub) }) {
		return fmt.Sprintf("not signed by reviewer %q's trusted key", clip(r.By))
	}
	return ""
}

// passkeyProblem is signerProblem for a record a passkey signed: by a
// passkey the trusted reviewers file lists for its reviewer, over its
// PasskeyChallenge.
func (t Trust) passkeyProblem(r *Record, cache *Cache, line []byte) string {
	a, err := r.PasskeyAssertion()
	if err != nil {
		return err.Error()
	}
	var cred passkey.Credential
	found := false
	for _, c := range t.Passkeys[r.By] {
		if c.ID == a.CredentialID {
			cred, found = c, true
			break
		}
	}
	switch {
	case !found:
		return fmt.Sprintf("passkey %s is not listed for reviewer %q in the trusted reviewers file", clip(a.CredentialID), clip(r.By))
	case r.KID != PasskeyKID:
		return fmt.Sprintf("it names key %s, not a passkey", clip(r.KID))
	case t.Granted != nil && !t.Granted(r.By):
		return fmt.Sprintf("reviewer %q is trusted, but not granted this tenant", clip(r.By))
	}
	var why error
	if !cache.verified([]byte("passkey\x00"+cred.ID+"\x00"+cred.PublicKey), line, func() error { why = r.VerifyPasskey(cred); return why }) {
		return fmt.Sprintf("not signed by reviewer %q's passkey: %v", clip(r.By), why)
	}
	return ""
}

// Cache remembers the records whose signature verified, by the key and
// every byte of the line, so that a question does not verify every
// mandate again. The zero value is ready; it is safe for concurrent use.
type Cache struct {
	mu sync.Mutex
	ok map[[32]byte]bool
}

func (c *Cache) verified(pub []byte, line []byte, verify func() error) bool {
	if c == nil {
		return verify() == nil
	}
	h := sha256.New()
	// The signer's length first: no signer and line run into another's.
	h.Write([]byte{byte(len(pub) >> 24), byte(len(pub) >> 16), byte(len(pub) >> 8), byte(len(pub))})
	h.Write(pub)
	h.Write(line)
	var k [32]byte
	copy(k[:], h.Sum(nil))
	c.mu.Lock()
	hit := c.ok[k]
	c.mu.Unlock()
	if hit {
		return true
	}
	if verify() != nil {
		return false
	}
	c.mu.Lock()
	if c.ok == nil || len(c.ok) > 1<<16 {
		c.ok = map[[32]byte]bool{}
	}
	c.ok[k] = true
	c.mu.Unlock()
	return true
}

// Mandate is one grant as the records say it stands.
type Mandate struct {
	Grant Record
	// TermsHash names the grant's terms (Record.TermsHash).
	TermsHash string
	// Signers are the distinct trusted reviewers whose signature of the
	// terms verified, the grantor first.
	Signers []string
	// Revoked is the revocation that ended it, if one did.
	Revoked *Record
}

// Needs is how many distinct reviewers must sign it.
func (m *Mandate) Needs() int { return max(m.Grant.Approvals, 1) }

// Complete says whether as many reviewers as it needs signed it.
func (m *Mandate) Complete() bool { return len(m.Signers) >= m.Needs() }

// Set is a verified reading of a store's mandate records.
type Set struct {
	// Mandates by id, and their ids in the order granted.
	Mandates map[string]*Mandate
	Order    []string
	// Findings say what did not verify. A set with findings cannot say
	// which mandates stand: nothing is allowed under any of them.
	Findings []string
	// Head is the hash of the last line read ("" for none): the prev of
	// the next record.
	Head string
	// Lines is how many lines were read.
	Lines int
}

// Read verifies the lines of a store's mandate records for tenant under
// trust. cache may be nil.
func Read(lines [][]byte, tenant string, trust Trust, cache *Cache) Set {
	s := Set{Mandates: map[string]*Mandate{}, Lines: len(lines)}
	find := func(i int, format string, a ...any) {
		s.Findings = append(s.Findings, fmt.Sprintf("mandate record %d: ", i+1)+fmt.Sprintf(format, a...))
	}
	prev := ""
	for i, line := range lines {
		r, err := Parse(line)
		want := prev
		prev = Hash(line)
		if err != nil {
			find(i, "%v", err)
			continue
		}
		if r.Prev != want {
			find(i, "does not link to the record before it (a record removed, inserted or reordered)")
			continue
		}
		if r.Tenant != tenant {
			find(i, "was signed for tenant %q, not %q (moved between tenants' stores)", clip(r.Tenant), clip(tenant))
			continue
		}
		if why := trust.signerProblem(&r, cache, line); why != "" {
			find(i, "%s of mandate %s is not trusted: %s", r.Kind, r.ID, why)
			continue
		}
		m := s.Mandates[r.ID]
		switch r.Kind {
		case KindGrant:
			if m != nil {
				find(i, "grants mandate %s again", r.ID)
				continue
			}
			s.Mandates[r.ID] = &Mandate{Grant: r, TermsHash: r.TermsHash(), Signers: []string{r.By}}
			s.Order = append(s.Order, r.ID)
		case KindSign, KindRevoke:
			switch {
			case m == nil:
				find(i, "a %s of mandate %s, which no record before it grants", r.Kind, r.ID)
				continue
			case r.Terms != m.TermsHash:
				find(i, "a %s of mandate %s names other terms than its grant's", r.Kind, r.ID)
				continue
			}
			if r.Kind == KindRevoke {
				if m.Revoked == nil {
					rr := r
					m.Revoked = &rr
				}
				continue
			}
			signed := false
			for _, by := range m.Signers {
				signed = signed || by == r.By
			}
			if !signed {
				m.Signers = append(m.Signers, r.By)
			}
		}
	}
	s.Head = prev
	return s
}

// Spent is what a mandate's uses add up to.
type Spent struct {
	Count  int
	Atomic *big.Int
}

// Use is one payment a mandate is asked to cover.
type Use struct {
	Tenant, Caller string
	// PayTo is the payee address (canonical), Host the host paid for
	// ("" when the question names none).
	PayTo, Host string
	Asset       string
	Atomic      *big.Int
	At          time.Time
}

// Refuses says why m does not cover u, after what its uses spent (""
// when it does).
func (m *Mandate) Refuses(u Use, spent Spent) string {
	g := &m.Grant
	exp, _ := ParseTime(g.Expires)
	switch {
	case m.Revoked != nil:
		return fmt.Sprintf("revoked by %s at %s", m.Revoked.By, m.Revoked.At)
	case !m.Complete():
		return fmt.Sprintf("signed by %d of the %d reviewers it needs", len(m.Signers), m.Needs())
	case g.Tenant != u.Tenant:
		return "granted for another tenant"
	case !equalFold(g.PayTo, u.PayTo):
		return "for another payee"
	case g.Host != "" && g.Host != u.Host:
		return "for another host"
	case g.Agent != "" && g.Agent != u.Caller:
		return "for another caller"
	case g.Asset != u.Asset:
		return "in another asset"
	case !u.At.Before(exp):
		return "expired at " + g.Expires
	case u.Atomic == nil:
		return "the amount cannot be read"
	case u.Atomic.Cmp(g.Max()) > 0:
		return "more than its most per payment"
	}
	if g.NotBefore != "" {
		if nb, _ := ParseTime(g.NotBefore); u.At.Before(nb) {
			return "not usable before " + g.NotBefore
		}
	}
	used := spent.Atomic
	if used == nil {
		used = new(big.Int)
	}
	if new(big.Int).Add(used, u.Atomic).Cmp(g.Budget()) > 0 {
		return "its budget left is less than the amount"
	}
	if g.Count > 0 && spent.Count+1 > g.Count {
		return fmt.Sprintf("its %d payments are used", g.Count)
	}
	return ""
}

// Left is what remains of m after spent: the budget, and the payments
// (-1: no count).
func (m *Mandate) Left(spent Spent) (*big.Int, int) {
	used := spent.Atomic
	if used == nil {
		used = new(big.Int)
	}
	left := new(big.Int).Sub(m.Grant.Budget(), used)
	if left.Sign() < 0 {
		left.SetInt64(0)
	}
	if m.Grant.Count == 0 {
		return left, -1
	}
	return left, max(m.Grant.Count-spent.Count, 0)
}

// Sorted lists the mandates that expire first first (then by id): the
// order a question tries them in.
func (s Set) Sorted() []*Mandate {
	out := make([]*Mandate, 0, len(s.Order))
	for _, id := range s.Order {
		out = append(out, s.Mandates[id])
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Grant.Expires != out[j].Grant.Expires {
			return out[i].Grant.Expires < out[j].Grant.Expires
		}
		return out[i].Grant.ID < out[j].Grant.ID
	})
	return out
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
