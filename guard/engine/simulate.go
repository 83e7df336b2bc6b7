package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/policy"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// A policy is tried on history by asking every recorded question again, in
// the order asked, of an Engine built with the candidate policy whose clock
// is set to the question's time and whose history source and Book see the
// Trace and the spend ledger as they stood then (a replayTrace, the Book
// fed the entries written before it). The answer comes from the same
// parse, ledger and rules as a live one (parse, withLedger, decide); what
// the review log made of the recorded answer (a human approval used, a
// rejection held, a full review queue) is applied to it as Ask would. It
// writes nothing: the store is only read, in one view.
//
// Each question is judged against what was recorded, not against what the
// candidate would have recorded before it: the holds are those the
// recorded allows made. A change therefore does not cascade (an allow the
// candidate would have turned into a review still counts for the next
// question), as an operator reading "what would this policy have said to
// each of these" expects.

// SimulateConfig is what Simulate reads.
type SimulateConfig struct {
	// Policy and Rules are the candidate policy and its custom rules.
	Policy *guard.Config
	Rules  *policy.Policy
	// Templates and History are the Trace (the whole of it: Simulate
	// shows each question the part that stood at its time).
	Templates Templates
	History   HistorySource
	// Log is the guard's store, read once, in one view.
	Log *reviewlog.Log
	// Tenant is the tenant the server signs as (the ledger's entries name
	// it).
	Tenant string
	// ParamsKey is the server's params key: it verifies the kept
	// questions' seals, their paramsHash and the ledger's seals.
	ParamsKey []byte
	// Keyring verifies the decision chains (nil: the store's keyring).
	Keyring noa.Keyring
	// Since, when set, replays only the questions asked at or after it
	// (earlier ones still stand in the ledger and the Trace).
	Since  time.Time
	Logger *slog.Logger
}

// Replayed outcomes besides the three decisions: the candidate policy
// refuses the question as asked (a template it does not read, an asset
// reference it cannot resolve...).
const Refused = "refused"

// Change is one recorded decision the candidate would have answered
// otherwise.
type Change struct {
	At      time.Time `json:"at"`
	Receipt string    `json:"receipt_id"`
	Kind    string    `json:"kind"`
	Caller  string    `json:"caller"`
	// Counterparty is the question's counterparty, PayTo the payee
	// address beside a host.
	Counterparty string `json:"counterparty"`
	PayTo        string `json:"pay_to,omitempty"`
	// Amount is the amount as asked, with its symbol when known
	// ("0.25 USDC").
	Amount string `json:"amount"`
	From   string `json:"from"`
	To     string `json:"to"`
	// Rule is the rule that decides under the candidate (for a change to
	// allow: the recorded rule that no longer applies); Detail says why.
	Rule   string `json:"rule"`
	Detail string `json:"detail"`
}

// Unverifiable is a kept question that is not replayed: its seal, its
// receipt or its paramsHash does not verify.
type Unverifiable struct {
	Receipt string `json:"receipt_id"`
	Why     string `json:"why"`
}

// Simulation is what trying a policy on history found.
type Simulation struct {
	// Replayed is how many questions were asked again; Changes are those
	// answered otherwise, in the order asked; Transitions counts them by
	// "from→to".
	Replayed    int            `json:"replayed"`
	Changes     []Change       `json:"changes"`
	Transitions map[string]int `json:"transitions"`
	// Unchanged is Replayed minus the changes.
	Unchanged int `json:"unchanged"`
	// WithoutQuestion are decisions signed without a kept question
	// (before questions were kept, or one too long to keep): not
	// replayed. Unverifiable are kept questions not trusted.
	WithoutQuestion int            `json:"without_question"`
	Unverifiable    []Unverifiable `json:"unverifiable"`
	// Orphans are kept questions whose receipt no decision chain holds
	// (what a crash between the two can leave on files).
	Orphans int `json:"orphans"`
	// LedgerFindings are what did not verify in the spend ledger; every
	// question after them is judged as a live one would be: review.
	LedgerFindings []string `json:"ledger_findings,omitempty"`
	// From and To bound the questions replayed (zero when none).
	From time.Time `json:"from,omitzero"`
	To   time.Time `json:"to,omitzero"`
}

// decision is one signed answer to a question, as its receipt says.
type decision struct {
	id, caller, paramsHash, verdict, rule string
	at                                    time.Time
	chainBad                              string
	// seq is its place in the chains as read (each chain in its order):
	// of two answers of the same time, the one signed first.
	seq int
}

// Simulate replays every kept question under cfg.Policy and says which
// answers would change. It writes nothing.
func Simulate(ctx context.Context, cfg SimulateConfig) (*Simulation, error) {
	if len(cfg.ParamsKey) == 0 {
		return nil, errors.New("simulate: no params key")
	}
	if cfg.Log == nil {
		return nil, errors.New("simulate: no store")
	}
	var (
		lines [][]byte
		raws  []ledger.Raw
		recs  = map[string]*decision{}
	)
	err := cfg.Log.Store().View(ctx, func(r reviewlog.Reader) error {
		src, ok := r.(reviewlog.QuestionSource)
		if ok {
			if err := src.Questions(ctx, func(line []byte) error {
				lines = append(lines, append([]byte(nil), line...))
				return nil
			}); err != nil {
				return err
			}
		}
		var err error
		if raws, err = r.Ledger().Since(ctx, nil); err != nil {
			return fmt.Errorf("read the spend ledger: %w", err)
		}
		return readDecisions(ctx, r, cfg.Keyring, recs)
	})
	if err != nil {
		return nil, err
	}
	return replay(ctx, cfg, lines, raws, recs)
}

// readDecisions verifies every decision chain and collects the signed
// answers to questions by receipt id; those of a chain that does not
// verify are marked so.
func readDecisions(ctx context.Context, r reviewlog.Reader, kr noa.Keyring, out map[string]*decision) error {
	if kr == nil {
		var err error
		if kr, err = r.Keyring(ctx); err != nil {
			return fmt.Errorf("read the keyring: %w", err)
		}
		if kr == nil {
			kr = noa.Keyring{}
		}
	}
	chains, err := reviewlog.ListChains(ctx, r)
	if err != nil {
		return fmt.Errorf("list the decision chains: %w", err)
	}
	for _, c := range chains {
		res, err := reviewlog.VerifySegments(ctx, r, c.ID, noa.Options{Keyring: kr, InFileOrder: true})
		if err != nil {
			return fmt.Errorf("verify the decision chain %s: %w", c.ID, err)
		}
		bad := ""
		if res.Verdict != noa.Valid {
			bad = fmt.Sprintf("its receipt is in the decision chain %s, which does not verify (%s)", c.ID, res.Line())
		}
		err = reviewlog.EachReceipt(ctx, r, c.ID, func(_ reviewlog.Segment, _ int64, rc *noa.Receipt) error {
			if !isAnswer(rc) {
				return nil
			}
			at, err := time.Parse(time.RFC3339Nano, rc.TS)
			if err != nil {
				return nil
			}
			rule := ""
			if rc.Governance.RuleID != nil {
				rule = *rc.Governance.RuleID
			}
			out[rc.ID] = &decision{id: rc.ID, caller: rc.Agent.ID, paramsHash: rc.Action.ParamsHash, verdict: decisionOf(rc.Governance.Verdict), rule: rule, at: at, chainBad: bad, seq: len(out)}
			return nil
		})
		if err != nil {
			return fmt.Errorf("read the decision chain %s: %w", c.ID, err)
		}
	}
	return nil
}

// isAnswer says whether a receipt is the engine's answer to a question
// (not a review's signed terms, a reviewer's decision, a call's outcome,
// an authorization's record or the ledger's start).
func isAnswer(rc *noa.Receipt) bool {
	if rc.Agent.Principal != noa.PrincipalService || rc.Agent.ID == noa.ContinueAgent {
		return false
	}
	if rc.Action.Canonical != actionCanonical && rc.Action.Canonical != reviewlog.CanonicalAuthorization {
		return false
	}
	if rc.Governance.RuleID != nil && *rc.Governance.RuleID == reviewlog.RuleReviewTerms {
		return false
	}
	return decisionOf(rc.Governance.Verdict) != ""
}

func decisionOf(verdict string) string {
	switch verdict {
	case noa.VerdictAllowed:
		return guard.Allow
	case noa.VerdictDeferred:
		return guard.Review
	case noa.VerdictBlocked:
		return guard.Block
	}
	return ""
}

// replayItem is one verified question and its recorded answer.
type replayItem struct {
	kq  KeptQuestion
	rec *decision
}

func replay(ctx context.Context, cfg SimulateConfig, lines [][]byte, raws []ledger.Raw, recs map[string]*decision) (*Simulation, error) {
	out := &Simulation{Transitions: map[string]int{}, Changes: []Change{}, Unverifiable: []Unverifiable{}}
	kept := map[string]bool{}
	var items []replayItem
	for i, line := range lines {
		kq, err := readKept(cfg.ParamsKey, line)
		if err != nil {
			id := kq.Receipt
			if id == "" {
				id = fmt.Sprintf("(kept question %d)", i+1)
			}
			out.Unverifiable = append(out.Unverifiable, Unverifiable{Receipt: id, Why: err.Error()})
			kept[kq.Receipt] = true
			continue
		}
		if kept[kq.Receipt] {
			out.Unverifiable = append(out.Unverifiable, Unverifiable{Receipt: kq.Receipt, Why: "a second question is kept for this receipt"})
			continue
		}
		kept[kq.Receipt] = true
		rec, ok := recs[kq.Receipt]
		if !ok {
			out.Orphans++
			continue
		}
		if why := verifyKept(cfg.ParamsKey, kq, rec); why != "" {
			out.Unverifiable = append(out.Unverifiable, Unverifiable{Receipt: kq.Receipt, Why: why})
			continue
		}
		if !cfg.Since.IsZero() && rec.at.Before(cfg.Since) {
			continue
		}
		items = append(items, replayItem{kq: kq, rec: rec})
	}
	for id, rec := range recs {
		if !kept[id] && (cfg.Since.IsZero() || !rec.at.Before(cfg.Since)) {
			out.WithoutQuestion++
		}
	}
	slices.SortFunc(items, func(a, b replayItem) int {
		if c := a.rec.at.Compare(b.rec.at); c != 0 {
			return c
		}
		return cmp.Compare(a.rec.seq, b.rec.seq)
	})
	if len(items) == 0 {
		return out, nil
	}
	out.From, out.To = items[0].rec.at, items[len(items)-1].rec.at

	trace, err := newReplayTrace(ctx, cfg)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var clock time.Time
	e, err := New(Config{Policy: cfg.Policy, Rules: cfg.Rules, Templates: cfg.Templates, History: trace, Log: cfg.Log,
		Chains: &reviewlog.Chains{Tenant: cfg.Tenant}, ParamsKey: cfg.ParamsKey, Now: func() time.Time { return clock }, Logger: logger})
	if err != nil {
		return nil, err
	}
	feed := newLedgerFeed(raws)
	applied := int64(0)
	for _, it := range items {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		clock = it.rec.at
		trace.advance(clock)
		out.LedgerFindings = append(out.LedgerFindings, e.book.Apply(feed.upTo(clock))...)
		if n := e.book.Applied(); n-applied > 256 {
			applied = n
			e.book.Prune(clock)
		}
		to, rule, detail, err := e.replayOne(ctx, it, trace, clock)
		if err != nil {
			return nil, err
		}
		out.Replayed++
		if to == it.rec.verdict {
			out.Unchanged++
			continue
		}
		if to == guard.Allow {
			rule, detail = it.rec.rule, "the candidate policy allows it"
			if rule == "" {
				rule = "-"
			}
		}
		q := it.kq.Question
		amount := q.Amount
		if a, ok := cfg.Policy.Assets.Lookup(q.Asset); ok && a.Symbol != "" {
			amount += " " + a.Symbol
		} else if q.Asset != "" {
			amount += " " + q.Asset
		}
		out.Changes = append(out.Changes, Change{At: clock, Receipt: it.rec.id, Kind: it.kq.Kind, Caller: it.kq.Caller, Counterparty: q.Counterparty, PayTo: q.PayTo,
			Amount: amount, From: it.rec.verdict, To: to, Rule: rule, Detail: detail})
		out.Transitions[it.rec.verdict+"→"+to]++
	}
	return out, nil
}

// verifyKept says why a kept question cannot be trusted as the question
// its receipt answered ("" when it can).
func verifyKept(key []byte, kq KeptQuestion, rec *decision) string {
	if rec.chainBad != "" {
		return rec.chainBad
	}
	if rec.caller != kq.Caller {
		return fmt.Sprintf("its receipt was signed for caller %q, not %q", clipText(rec.caller), clipText(kq.Caller))
	}
	h, err := kq.paramsHash(key)
	if err != nil {
		return "its paramsHash cannot be computed: " + err.Error()
	}
	if h != rec.paramsHash {
		return "its paramsHash does not match the signed receipt's: it is not the question the receipt answered"
	}
	return ""
}

// replayOne answers one recorded question again under the engine's
// policy, at its time, and applies what the review log made of the
// recorded answer.
func (e *Engine) replayOne(ctx context.Context, it replayItem, trace *replayTrace, now time.Time) (to, rule, detail string, err error) {
	pol := e.Policy().For(it.kq.Caller)
	req, err := e.parse(pol, it.kq.raw())
	if err != nil {
		var re *RefusedError
		if errors.As(err, &re) {
			return Refused, "refused", re.Message, nil
		}
		return "", "", "", err
	}
	hist, err := e.history(ctx)
	if err != nil {
		return "", "", "", err
	}
	var judged guard.History
	if pays, ok := trace.payments(now.Add(-e.book.Horizon()), now); ok {
		judged = e.withLedgerPaid(hist, now, func() []ledger.Payment { return pays })
	} else {
		judged = e.withLedger(hist, now)
	}
	dec := e.decide(req, judged, pol, now, nil)
	to = dec.Decision
	if r := firstRule(dec); r != nil {
		rule = *r
		for _, x := range dec.Reasons {
			if x.Rule == rule {
				detail = x.Detail
				break
			}
		}
	}
	// What the review log made of the recorded answer stands for the
	// same question: a reviewer's approval answers the review the
	// candidate would ask for, a rejection holds whatever the rules say
	// (Ask: only a block is not turned), a full queue opens none.
	switch it.rec.rule {
	case reviewlog.RuleHumanApproved:
		if to == guard.Review {
			to, rule, detail = guard.Allow, reviewlog.RuleHumanApproved, "the reviewer's approval answers the review"
		}
	case reviewlog.RuleHumanRejected:
		if to != guard.Block {
			to, rule, detail = guard.Block, reviewlog.RuleHumanRejected, "the reviewer's rejection holds"
		}
	case RuleQueueFull:
		if to == guard.Review {
			to, rule, detail = guard.Block, RuleQueueFull, "the caller's review queue was full"
		}
	}
	return to, rule, detail, nil
}

// replayTrace is the Trace as it stood at the replay's clock: the
// operations whose first event occurred at or before it, read once and
// revealed in order, each template's index extended as they come.
type replayTrace struct {
	views map[string]*traceView
	// single: the policy reads one template, whose payments are served
	// sorted (payments).
	single *traceView
}

type traceView struct {
	sorted []guard.Op
	at     []time.Time
	pays   []ledger.Payment
	full   guard.History
	cur    guard.History
	n      int
}

func newReplayTrace(ctx context.Context, cfg SimulateConfig) (*replayTrace, error) {
	rt := &replayTrace{views: map[string]*traceView{}}
	for _, name := range cfg.Policy.HistoryTemplates {
		t, err := cfg.Templates.Resolve(name)
		if err != nil {
			return nil, fmt.Errorf("guard config historyTemplates names %q, which cannot be used: %w", name, err)
		}
		h, err := cfg.History.History(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("read history under %s: %w", name, err)
		}
		v := &traceView{full: h}
		type timed struct {
			at time.Time
			op guard.Op
		}
		ts := make([]timed, len(h.Ops))
		for i, o := range h.Ops {
			// An operation whose first time does not read stood from the
			// start: it is never hidden.
			at, _ := time.Parse(time.RFC3339Nano, o.FirstEventAt)
			ts[i] = timed{at: at, op: o}
		}
		sort.SliceStable(ts, func(i, j int) bool { return ts[i].at.Before(ts[j].at) })
		v.sorted = make([]guard.Op, len(ts))
		v.at = make([]time.Time, len(ts))
		for i, x := range ts {
			v.sorted[i], v.at[i] = x.op, x.at
		}
		v.pays = guard.History{Ops: v.sorted}.Payments(time.Time{})
		v.cur = guard.History{Ops: v.sorted[:0], Runs: h.Runs, Unreadable: h.Unreadable}
		v.cur.BuildIndex()
		rt.views[t.Name] = v
	}
	if len(rt.views) == 1 {
		for _, v := range rt.views {
			rt.single = v
		}
	}
	return rt, nil
}

// advance reveals the operations that had begun by now.
func (rt *replayTrace) advance(now time.Time) {
	for _, v := range rt.views {
		n := v.n
		for n < len(v.sorted) && !v.at[n].After(now) {
			n++
		}
		if n != v.n {
			v.n = n
			v.cur.Ops = v.sorted[:n]
			v.cur.ExtendIndex()
		}
	}
}

// History is the Trace under t as it stood at the clock.
func (rt *replayTrace) History(_ context.Context, t *receipt.Template) (guard.History, error) {
	v, ok := rt.views[t.Name]
	if !ok {
		return guard.History{}, fmt.Errorf("template %s was not read for the replay", t.Name)
	}
	return v.cur, nil
}

// payments are the payments the Trace showed between since and now, when
// one template is read (its payments are sorted by time).
func (rt *replayTrace) payments(since, now time.Time) ([]ledger.Payment, bool) {
	v := rt.single
	if v == nil {
		return nil, false
	}
	lo := sort.Search(len(v.pays), func(i int) bool { return !v.pays[i].At.Before(since) })
	hi := sort.Search(len(v.pays), func(i int) bool { return v.pays[i].At.After(now) })
	if hi < lo {
		hi = lo
	}
	return v.pays[lo:hi], true
}

// ledgerFeed hands the ledger's lines out in the order of their times,
// each lane's in its own order (a Book takes each lane in order).
type ledgerFeed struct {
	lanes [][]ledger.Raw
	ats   [][]time.Time
	next  []int
}

func newLedgerFeed(raws []ledger.Raw) *ledgerFeed {
	f := &ledgerFeed{lanes: make([][]ledger.Raw, ledger.Lanes), ats: make([][]time.Time, ledger.Lanes), next: make([]int, ledger.Lanes)}
	for _, r := range raws {
		if r.Lane < 0 || r.Lane >= ledger.Lanes {
			continue
		}
		var at time.Time
		if e, err := ledger.Peek(r.Line); err == nil {
			at, _ = ledger.ParseTime(e.At)
		}
		f.lanes[r.Lane] = append(f.lanes[r.Lane], r)
		f.ats[r.Lane] = append(f.ats[r.Lane], at)
	}
	return f
}

// upTo is every line not handed out yet written before now, in each
// lane's order: a line whose time does not read goes with the lines
// around it.
func (f *ledgerFeed) upTo(now time.Time) []ledger.Raw {
	var out []ledger.Raw
	for lane := range f.lanes {
		i := f.next[lane]
		for i < len(f.lanes[lane]) && f.ats[lane][i].Before(now) {
			out = append(out, f.lanes[lane][i])
			i++
		}
		f.next[lane] = i
	}
	return out
}
