package mandate

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const payee = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"

var t0 = time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC)

// chain signs records in order, each linked to the one before, and reads
// them back.
type chain struct {
	lines [][]byte
	keys  map[string]ed25519.PrivateKey
}

func newChain(ids ...string) *chain {
	c := &chain{keys: map[string]ed25519.PrivateKey{}}
	for _, id := range ids {
		_, k, _ := ed25519.GenerateKey(rand.Reader)
		c.keys[id] = k
	}
	return c
}

func (c *chain) trust() Trust {
	t := Trust{Keys: map[string]ed25519.PublicKey{}}
	for id, k := range c.keys {
		t.Keys[id] = k.Public().(ed25519.PublicKey)
	}
	return t
}

func (c *chain) add(t *testing.T, by string, r Record, at time.Time) Record {
	t.Helper()
	r.Tenant, r.By, r.KID, r.At = "acme", by, noa.KeyID(c.keys[by].Public().(ed25519.PublicKey)), FormatTime(at)
	if len(c.lines) > 0 {
		r.Prev = Hash(c.lines[len(c.lines)-1])
	}
	line, err := r.Sign(c.keys[by])
	if err != nil {
		t.Fatal(err)
	}
	c.lines = append(c.lines, line)
	return r
}

func (c *chain) grant(t *testing.T, by string, count int) Record {
	id, _ := NewID()
	return c.add(t, by, Record{Kind: KindGrant, ID: id, PayTo: payee, Asset: "eip155:8453/0xusdc", MaxAtomic: "2000000", BudgetAtomic: "3000000",
		Count: count, Expires: FormatTime(t0.Add(24 * time.Hour))}, t0)
}

func use(id, receipt string, atomic string, at time.Time) ledger.Entry {
	return ledger.Entry{Kind: ledger.KindHold, Receipt: receipt, Caller: "bot", Tenant: "acme", PayTo: payee, Asset: "eip155:8453/0xusdc",
		Atomic: atomic, At: ledger.FormatTime(at), Mandate: id}
}

func TestRecordIsReadOneWay(t *testing.T) {
	c := newChain("alice")
	g := c.grant(t, "alice", 0)
	r, err := Parse(c.lines[0])
	if err != nil || r.ID != g.ID || r.Verify(c.trust().Keys["alice"]) != nil {
		t.Fatalf("round trip: %v %+v", err, r)
	}
	for name, line := range map[string]string{
		"a member repeated": strings.Replace(string(c.lines[0]), `"v":1,`, `"v":1,"v":1,`, 1),
		"a member added":    strings.Replace(string(c.lines[0]), `"v":1,`, `"v":1,"x":2,`, 1),
		"not JSON":          "{",
	} {
		if _, err := Parse([]byte(line)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

// Audit holds every use to the mandate as signed: within its bounds, not
// after its revocation, under a grant a trusted reviewer signed.
func TestAuditHoldsUsesToTheirMandate(t *testing.T) {
	c := newChain("alice", "bob")
	g := c.grant(t, "alice", 2)
	c.add(t, "bob", Record{Kind: KindRevoke, ID: g.ID, Terms: g.TermsHash()}, t0.Add(2*time.Hour))
	set := Read(c.lines, "acme", c.trust(), nil)
	if len(set.Findings) > 0 || set.Mandates[g.ID].Revoked == nil {
		t.Fatalf("the records: %+v", set)
	}
	ok := []ledger.Entry{use(g.ID, "r1", "1000000", t0.Add(time.Minute)), use(g.ID, "r2", "1500000", t0.Add(time.Hour))}
	if out := Audit(set, ok); len(out) != 0 {
		t.Fatalf("uses within the mandate: %v", out)
	}
	tests := []struct {
		name string
		uses []ledger.Entry
		want string
	}{
		{"after its revocation", []ledger.Entry{use(g.ID, "r1", "1000000", t0.Add(3*time.Hour))}, "revoked by bob"},
		{"more than its most", append(ok[:1:1], use(g.ID, "r2", "2500000", t0.Add(time.Hour))), "more than its most per payment"},
		{"more than its most by one unit", append(ok[:1:1], use(g.ID, "r2", "2000001", t0.Add(time.Hour))), "more than its most per payment"},
		{"past its count", []ledger.Entry{use(g.ID, "r1", "1", t0.Add(time.Minute)), use(g.ID, "r2", "1", t0.Add(time.Minute)), use(g.ID, "r3", "1", t0.Add(time.Minute))}, "its 2 payments are used"},
		{"budget", []ledger.Entry{use(g.ID, "r1", "2000000", t0.Add(time.Minute)), use(g.ID, "r2", "1500000", t0.Add(time.Minute))}, "its budget left is less than the amount"},
		{"to another payee", []ledger.Entry{func() ledger.Entry {
			e := use(g.ID, "r1", "1", t0)
			e.PayTo = "0x0000000000000000000000000000000000000001"
			return e
		}()}, "for another payee"},
		{"a mandate nobody granted", []ledger.Entry{use("m_0123456789abcdef", "r1", "1", t0)}, "which no signed record of a trusted reviewer grants"},
	}
	for _, tc := range tests {
		if out := strings.Join(Audit(set, tc.uses), "\n"); !strings.Contains(out, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, out, tc.want)
		}
	}
	// A reviewer no longer trusted: the grant does not stand, and every
	// use of it is a finding.
	tr := c.trust()
	delete(tr.Keys, "alice")
	if out := strings.Join(Audit(Read(c.lines, "acme", tr, nil), ok), "\n"); !strings.Contains(out, `reviewer "alice" is not in the trusted reviewers file`) {
		t.Fatalf("an untrusted grantor: %q", out)
	}
}

// A mandate a quorum asks two reviewers for is unusable with one; a
// second signature by the same reviewer counts once.
func TestMandateNeedsItsSignatures(t *testing.T) {
	c := newChain("alice", "bob")
	id, _ := NewID()
	g := c.add(t, "alice", Record{Kind: KindGrant, ID: id, PayTo: payee, Asset: "a", MaxAtomic: "1", BudgetAtomic: "1", Approvals: 2, Expires: FormatTime(t0.Add(time.Hour))}, t0)
	u := Use{Tenant: "acme", Caller: "bot", PayTo: payee, Asset: "a", Atomic: g.Max(), At: t0}
	c.add(t, "alice", Record{Kind: KindSign, ID: id, Terms: g.TermsHash()}, t0)
	m := Read(c.lines, "acme", c.trust(), nil).Mandates[id]
	if why := m.Refuses(u, Spent{}); why != "signed by 1 of the 2 reviewers it needs" {
		t.Fatalf("alice twice: %q", why)
	}
	c.add(t, "bob", Record{Kind: KindSign, ID: id, Terms: g.TermsHash()}, t0)
	if m := Read(c.lines, "acme", c.trust(), nil).Mandates[id]; m.Refuses(u, Spent{}) != "" || len(m.Signers) != 2 {
		t.Fatalf("with bob: %q %v", m.Refuses(u, Spent{}), m.Signers)
	}
}

var usdc = guard.Asset{Symbol: "USDC", Decimals: 6, Key: "eip155:8453/0x833589fcd6edb6e08f4c7c32d4f71b54bda02913"}

const ap2OK = `{"vct": "mandate.payment.open.1", "cnf": {"jwk": {}}, "exp": 1800000000,
 "constraints": [
  {"type": "payment.allowed_payees", "allowed": [{"id": "` + payee + `", "name": "Weather API", "website": "https://api.weather.example/v1"}]},
  {"type": "payment.amount_range", "currency": "USD", "max": 250},
  {"type": "payment.budget", "currency": "USD", "max": 20.5},
  {"type": "payment.agent_recurrence", "frequency": "ON_DEMAND", "max_occurrences": 10},
  {"type": "payment.execution_date", "not_before": "2026-07-01", "not_after": "2026-12-31T00:00:00Z"},
  {"type": "payment.reference", "conditional_transaction_id": "sha256:abc"}]}`

func TestParseAP2(t *testing.T) {
	r, err := ParseAP2([]byte(ap2OK), usdc, t0)
	if err != nil {
		t.Fatal(err)
	}
	want := Record{Source: AP2Source, Asset: usdc.Key, PayTo: strings.ToLower(payee), Host: "api.weather.example", MaxAtomic: "2500000", BudgetAtomic: "20500000", Count: 10,
		NotBefore: "2026-07-01T00:00:00.000Z", Expires: "2026-12-31T00:00:00.000Z", Reference: "sha256:abc"}
	if r != want {
		t.Fatalf("got %+v\nwant %+v", r, want)
	}
	refused := map[string]string{
		`"ON_DEMAND"`:                     `"DAILY"`,
		`"USD", "max": 250`:               `"EUR", "max": 250`,
		`"max": 250}`:                     `"max": 250, "min": 100}`,
		`"payment.reference"`:             `"payment.allowed_pisps"`,
		`"exp": 1800000000`:               `"exp": 1800000000, "payment_amount": {"amount": 1, "currency": "USD"}`,
		`"id": "` + payee + `"`:           `"id": "merchant-42"`,
		`"name": "Weather API", `:         `"name": "Weather API", "x": 1, `,
		`"vct": "mandate.payment.open.1"`: `"vct": "mandate.checkout.open.1"`,
	}
	for from, to := range refused {
		_, err := ParseAP2([]byte(strings.Replace(ap2OK, from, to, 1)), usdc, t0)
		if !errors.Is(err, ErrAP2Refused) {
			t.Errorf("%s → %s: %v, want it refused", from, to, err)
		}
	}
	if _, err := ParseAP2([]byte(ap2OK), usdc, time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("an expired mandate: %v", err)
	}
}

// FuzzParseAP2: whatever the bytes, ParseAP2 refuses them with
// ErrAP2Refused or gives terms a grant can be signed with.
func FuzzParseAP2(f *testing.F) {
	f.Add([]byte(ap2OK))
	f.Add([]byte(`{"vct":"mandate.payment.open.1","constraints":[]}`))
	f.Add([]byte(`[]`))
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseAP2(data, usdc, t0)
		if err != nil {
			if !errors.Is(err, ErrAP2Refused) {
				t.Fatalf("an error that is no refusal: %v", err)
			}
			return
		}
		id, _ := NewID()
		r.Kind, r.ID, r.Tenant, r.By, r.KID, r.At = KindGrant, id, "acme", "alice", "kid", FormatTime(t0)
		if _, err := r.Sign(key); err != nil {
			t.Fatalf("terms read cannot be signed: %v (%+v)", err, r)
		}
	})
}

// FuzzParse: a record line is read one way or refused, never with a
// panic.
func FuzzParse(f *testing.F) {
	c := newChain("alice")
	c.grant(&testing.T{}, "alice", 1)
	f.Add(c.lines[0])
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := Parse(line)
		if err != nil {
			return
		}
		if err := r.Check(); err != nil {
			t.Fatalf("parsed a record that does not check: %v", err)
		}
	})
}
