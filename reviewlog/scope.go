package reviewlog

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"sort"
	"strings"
	"time"
)

// The parts of the guard's state a decision reads and changes: two
// decisions wait for each other only when they name a scope in common
// (and, for ScopeTotals, one of them reads it).
const (
	// ScopeCaller: the caller's reviews (pending cap, idempotency, the
	// approval used once, the rejection that holds — every review key
	// names its caller).
	ScopeCaller = "caller"
	// ScopeCounterparty: what is paid, reserved and open to one
	// counterparty (an address or a host).
	ScopeCounterparty = "counterparty"
	// ScopeResource: what was paid for one resource (the duplicate
	// window).
	ScopeResource = "resource"
	// ScopeTotals: the sums over every counterparty (a total limit, a
	// total velocity, custom rules that read them). Every allow changes
	// them and takes this scope shared; a decision that reads them takes
	// it alone.
	ScopeTotals = "totals"
)

// Scope is one part of a tenant's state that a decision locks.
type Scope struct {
	Kind   string
	Tenant string
	// Key names the caller, counterparty or resource ("" for totals).
	Key string
	// Shared: the decision only adds to this scope's state, never reads
	// it; shared holders do not wait for each other.
	Shared bool
}

// LockKey is the scope's advisory lock key: a hash of its kind, tenant
// and key, so that the same scope of different tenants never shares a
// key. Counterparties and resources are compared without case, as the
// guard's canonical forms are.
func (s Scope) LockKey() int64 {
	h := sha256.New()
	key := s.Key
	if s.Kind == ScopeCounterparty || s.Kind == ScopeResource {
		key = strings.ToLower(key)
	}
	for _, part := range []string{"haia-trace-mcp/scope/v1", s.Kind, s.Tenant, key} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	return int64(binary.BigEndian.Uint64(h.Sum(nil)[:8]))
}

// LockOrder is scopes as they must be locked: one entry a lock key,
// exclusive where any of its scopes is, sorted by key so that two
// decisions never wait for each other in a cycle.
func LockOrder(scopes []Scope) []Scope {
	byKey := map[int64]Scope{}
	for _, s := range scopes {
		k := s.LockKey()
		if prev, ok := byKey[k]; ok && !prev.Shared {
			continue
		}
		byKey[k] = s
	}
	out := make([]Scope, 0, len(byKey))
	for _, s := range byKey {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LockKey() < out[j].LockKey() })
	return out
}

// ScopedStore is a store that can lock part of the guard's state: a
// database, where decisions of different scopes run at once. A store
// without it (the file store) locks everything for every decision.
type ScopedStore interface {
	Store
	// LockedScopes runs fn holding the locks of scopes only (the whole
	// state's lock shared, so that Locked still excludes it), waiting at
	// most wait (ErrLockTimeout). fn reads one consistent moment of every
	// stream, later than the last commit of every scope it holds; its
	// appends land at the end of each stream as it is at commit. When fn
	// returns nil, what it wrote is committed; otherwise nothing it wrote
	// is.
	//
	// pre, when not nil, names what the section will read beside its
	// locks' answers — the spend ledger from where this process last read
	// it, the chains' segments from where it last read them — so that the
	// store may read them in the round trip that takes the locks (after
	// every lock is held); the section then reads them as usual and gets
	// what was read.
	LockedScopes(ctx context.Context, wait time.Duration, scopes []Scope, pre *Prefetch, fn func(w Writer) error) error
}

// Prefetch is what a locked section will read beside its locks, named
// before it starts (see ScopedStore.LockedScopes).
type Prefetch struct {
	// Ledger are the positions the section reads the spend ledger from
	// (ledger.Reader.Since).
	Ledger []ledger.Pos
	// Segments are how far the section's process read each chain segment
	// (ReceiptTail); segments not named are read from their start.
	Segments map[string]SegmentMark
	// Caller and ParamsHash name the question whose reviews the chains'
	// receipts may name (a rejection that holds: ReceiptIndex's
	// QuestionReceipts); "": none.
	Caller, ParamsHash string
}

// ChainLaner is a Writer that appends each locked section's receipts to
// one of several chains of the signing key (a lane it holds alone until
// commit), so that sections of different scopes never wait for one
// chain's head. Lane 0 is the key's chain itself.
type ChainLaner interface {
	ChainLane() int
}

// errWiden: the section found that its answer depends on state outside
// its scopes; it is run again holding the whole state's lock.
var errWiden = errors.New("the answer needs the whole state's lock")

// scopes is what answering req locks: the caller's reviews, each
// counterparty it names, its resource, and the totals (alone when the
// caller's policy reads them).
func (req AskRequest) scopes() []Scope {
	t := req.Tenant
	out := []Scope{{Kind: ScopeCaller, Tenant: t, Key: req.Caller}, {Kind: ScopeCounterparty, Tenant: t, Key: req.Question.Counterparty}}
	if req.Question.PayTo != "" {
		out = append(out, Scope{Kind: ScopeCounterparty, Tenant: t, Key: req.Question.PayTo})
	}
	if req.Resource != "" {
		out = append(out, Scope{Kind: ScopeResource, Tenant: t, Key: req.Resource})
	}
	return append(out, Scope{Kind: ScopeTotals, Tenant: t, Shared: !req.Totals})
}

// ScopedWriter is the Writer of a section that holds only some scopes
// (LockedScopes); Scopes names them.
type ScopedWriter interface {
	Writer
	Scopes() []Scope
}
