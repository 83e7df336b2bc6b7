package payment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/big"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/runindex"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// TraceSettleGrace is how long after an authorization's validBefore a
// settlement event of the Trace may be dated and still be bound to it by
// its terms: the chain refuses the transfer after validBefore, and the
// settlement answer reaches the recorder a little later.
const TraceSettleGrace = 10 * time.Minute

// traceState is what the Authorizer remembers of the Trace between sweeps:
// each run file read (by its size, time and inode), and the listing swept
// last, so that a sweep over an unchanged Trace reads nothing.
type traceState struct {
	mu   sync.Mutex
	runs map[string]cachedRun
	fp   string
	// ambiguous are the keys of the ambiguities recorded (or found
	// recorded) by this process: not asked of the log again.
	ambiguous map[string]bool
	// gen counts the settlements this process recorded: one changes which
	// authorizations are pending, so a sweep is due even over an unchanged
	// Trace.
	gen atomic.Uint64
	// swept says a sweep completed, as of changes (the catalog's count of
	// listings that saw the runs change) and gen when it began.
	swept        atomic.Bool
	sweptChanges atomic.Uint64
	sweptGen     atomic.Uint64
	// first says a process's first sweep runs after an answer
	// (SettleFromTraceSeen).
	first atomic.Bool
	// payers are the payers whose settlements the cursors keep (with
	// those of operations that carry a nonce): this server's and those of
	// the authorizations in the log, as of the last reading of it. A payer
	// added later has every run read again.
	payers payerSet
	// saved is what an earlier process saved of its sweep (SweepFile),
	// read at this process's first sweep: the runs it need not read
	// again, each taken once (restore). loaded says it was read.
	saved  *savedSweep
	loaded bool
	// readBytes, readWhole and restored count what the sweeps read (see
	// TraceReads).
	readBytes, readWhole, restored atomic.Int64
	// save is the saving of the sweep (see saveSweep).
	save sweepSaver
}

type cachedRun struct {
	size int64
	mod  time.Time
	ino  uint64
	cur  runCursor
}

// readRun brings c up to date with the run file e: only the bytes appended
// since the last reading are read when the file is the same one, only
// grew, and still holds the bytes it started and ended with. A run this
// process has not read yet is taken from the saved sweep where that still
// holds (see restore).
func (a *Authorizer) readRun(e confined.Entry, name string, c cachedRun, had bool) (cachedRun, error) {
	if had && c.ino == e.Ino && c.size == e.Size && c.mod.Equal(e.ModTime) {
		return c, nil
	}
	f, err := a.cfg.Events.Open(e.Name)
	if err != nil {
		return c, fmt.Errorf("open the Trace's run %s: %w", name, err)
	}
	defer f.Close()
	st := a.trace
	if !had && st != nil {
		c, had = st.restore(f, e)
	} else if had && (c.ino != e.Ino || e.Size < c.cur.off || !holdsTail(f, c.cur)) {
		had = false
	}
	if !had {
		c = cachedRun{}
	}
	c.size, c.mod, c.ino = e.Size, e.ModTime, e.Ino
	var payers payerSet
	if st != nil {
		payers = st.payers
	}
	st.count(e.Size-c.cur.off, c.cur.off == 0)
	if err := c.cur.readMore(io.NewSectionReader(f, c.cur.off, e.Size-c.cur.off), name, payers); err != nil {
		return cachedRun{}, err
	}
	if c.cur.run.reread || c.cur.view.reread {
		// A nonce came for an operation whose settlement was left out:
		// read whole, where the nonce is seen before the settlement is
		// pruned.
		c = cachedRun{size: e.Size, mod: e.ModTime, ino: e.Ino}
		st.count(e.Size, true)
		if err := c.cur.readMore(io.NewSectionReader(f, 0, e.Size), name, payers); err != nil {
			return cachedRun{}, err
		}
	}
	if c.cur.head, c.cur.tail, err = runindex.HeadTail(f, c.cur.off); err != nil {
		return cachedRun{}, fmt.Errorf("read the Trace's run %s: %w", name, err)
	}
	return c, nil
}

// holdsTail says whether f still holds what c read it starting and ending
// with.
func holdsTail(f io.ReaderAt, c runCursor) bool {
	head, tail, err := runindex.HeadTail(f, c.off)
	return err == nil && head == c.head && tail == c.tail
}

// TraceSweep says what one reading of the Trace did.
type TraceSweep struct {
	// Recorded are the nonces whose settlement was recorded from the Trace.
	Recorded []string
	// Ambiguous are the authorizations a settlement of the Trace could be
	// the payment of by its terms, but not uniquely: none was bound, each
	// with why. Each is recorded once as a finding (reviewlog.Ambiguity)
	// and told to the reviewers.
	Ambiguous []string
	// Unreadable are settlement events of an authorization that could not
	// be read as a settlement answer, each with why.
	Unreadable []string
}

// SettleFromTrace reads the recorder's settlement events and records each
// one bound to an authorization this server signed and nobody settled yet,
// through the path record_receipt takes (the same checks, receipt, ledger
// release and settled line). A settlement is bound by the authorization's
// nonce when an event of its operation carries it; else by its terms —
// payer, payee, amount, asset, network and resource, dated from the
// signature to TraceSettleGrace after validBefore — when exactly one
// transaction of the Trace fits exactly one authorization. A Trace
// settlement with a finding keeps the hold.
//
// It runs at the start of authorize_payment, and after each
// check_before_pay (SettleFromTraceSeen), the decisions that read the
// Trace. It reads the review log only when what can bind changed since the
// last sweep (a settlement event or a nonce of the Trace, or a settlement
// this process recorded); of a run file it reads only what was appended
// since the last sweep (all of it again only when it was rewritten).
// One sweep runs at a time; a second caller meanwhile goes on without one.
func (a *Authorizer) SettleFromTrace(ctx context.Context) (TraceSweep, error) {
	var sw TraceSweep
	if a.cfg.Events == nil {
		return sw, nil
	}
	st := a.trace
	if !st.mu.TryLock() {
		return sw, nil
	}
	defer st.mu.Unlock()
	var changes uint64
	if a.cfg.TraceChanges != nil {
		changes = a.cfg.TraceChanges()
	}
	gen := st.gen.Load()
	swept := func() {
		st.sweptChanges.Store(changes)
		st.sweptGen.Store(gen)
		st.swept.Store(true)
	}
	if !a.cfg.Events.Exists() {
		swept()
		return sw, nil
	}
	if st.payers == nil {
		auths, err := a.cfg.Engine.Authorizations(ctx)
		if err != nil {
			return sw, err
		}
		st.payers = a.payersOf(auths)
	}
	if !st.loaded {
		st.loaded = true
		st.saved = a.loadSweep()
		for p := range st.payers {
			if st.saved != nil && !st.saved.payers[p] {
				a.cfg.Logger.Info("the saved sweep of the Trace's settlements kept fewer payers' settlements than the review log names: every run file is read",
					"file", a.sweepPath(), "payer", p)
				st.saved = nil
			}
		}
	}
	first := !st.swept.Load()
	began, bytes0, whole0, restored0 := time.Now(), st.readBytes.Load(), st.readWhole.Load(), st.restored.Load()
	for range 2 {
		sw, again, err := a.sweepTrace(ctx, changes, gen, swept)
		if err != nil || !again {
			if err == nil {
				if first {
					a.cfg.Logger.Info("the Trace's settlements are read", "bytes_read", st.readBytes.Load()-bytes0, "runs_read_whole", st.readWhole.Load()-whole0,
						"runs_from_the_saved_sweep", st.restored.Load()-restored0, "runs", len(st.runs), "took", time.Since(began).Round(time.Millisecond))
				}
				a.saveSweep()
			}
			return sw, err
		}
	}
	return TraceSweep{}, nil
}

// payersOf is this server's payer and those of auths, lower-cased.
func (a *Authorizer) payersOf(auths []reviewlog.AuthorizedLine) payerSet {
	p := payerSet{}
	if a.cfg.Signer != nil {
		p[a.cfg.Signer.Address().Lower()] = true
	}
	for _, au := range auths {
		p[strings.ToLower(au.From)] = true
	}
	return p
}

// sweepTrace is one reading of the Trace by SettleFromTrace. again says
// the log named a payer the cursors did not keep the settlements of: they
// were dropped, and the Trace is to be read again whole.
func (a *Authorizer) sweepTrace(ctx context.Context, changes, gen uint64, swept func()) (sw TraceSweep, again bool, err error) {
	st := a.trace
	entries, err := a.cfg.Events.ReadDir()
	if err != nil {
		return sw, false, fmt.Errorf("list the Trace's runs: %w", err)
	}
	var fp strings.Builder
	runs := map[string]traceRun{}
	seen := map[string]bool{}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name, ".ndjson")
		if !ok || !e.Regular() {
			continue
		}
		seen[e.Name] = true
		c, had := st.runs[e.Name]
		c, err := a.readRun(e, name, c, had)
		if err != nil {
			return sw, false, err
		}
		st.runs[e.Name] = c
		runs[name] = c.cur.view
		fmt.Fprintf(&fp, "%s\x00%x\n", name, c.cur.view.Sum)
	}
	// Only what can bind counts: lines of other events appended to a run
	// (most of what a recorder writes) change its size, not its Sum, and
	// read the review log for nothing.
	fmt.Fprintf(&fp, "gen %d\n", gen)
	for n := range st.runs {
		if !seen[n] {
			delete(st.runs, n)
		}
	}
	// Every run listed was taken from the saved sweep or read: what is
	// left of it names files gone.
	st.saved = nil
	if fp.String() == st.fp {
		swept()
		return sw, false, nil
	}
	auths, err := a.cfg.Engine.Authorizations(ctx)
	if err != nil {
		return sw, false, err
	}
	for p := range a.payersOf(auths) {
		if !st.payers[p] {
			// Another signer's authorization (a key changed, a replica
			// with its own): its settlements may have been left out.
			st.payers = a.payersOf(auths)
			clear(st.runs)
			st.fp = ""
			return sw, true, nil
		}
	}
	settled, err := a.cfg.Engine.Settlements(ctx)
	if err != nil {
		return sw, false, err
	}
	done := map[string]bool{}
	txs := map[string]string{}
	for _, s := range settled {
		done[strings.ToLower(s.Nonce)] = true
		txs[strings.ToLower(s.Transaction)] = strings.ToLower(s.Nonce)
	}
	var pending []reviewlog.AuthorizedLine
	for _, au := range auths {
		if !done[strings.ToLower(au.Nonce)] {
			pending = append(pending, au)
		}
	}
	bindings, amb := bindTrace(pending, runs, txs)
	complete := true
	for _, am := range amb {
		sw.Ambiguous = append(sw.Ambiguous, am.Text)
		if !a.recordAmbiguity(ctx, am) {
			complete = false
		}
	}
	for _, b := range bindings {
		s, err := x402.ParseSettlement(b.ev.Settle)
		if err != nil {
			sw.Unreadable = append(sw.Unreadable, fmt.Sprintf("authorization %s: the Trace's settlement (run %s, line %d) %s", b.auth.Nonce, b.ev.Run, b.ev.Line, err))
			continue
		}
		ref := &reviewlog.TraceRef{Run: b.ev.Run, Operation: b.ev.Operation, Line: b.ev.Line, Event: b.ev.Event, OccurredAt: b.ev.OccurredAt, Binding: b.by}
		_, err = a.record(ctx, settleInput{caller: b.auth.Caller, auth: b.auth, st: s, rcpt: s.Receipt, source: reviewlog.SourceTrace, trace: ref,
			findings: b.findings})
		var refused *RefusedError
		switch {
		case err == nil:
			sw.Recorded = append(sw.Recorded, strings.ToLower(b.auth.Nonce))
		case errors.As(err, &refused):
			// The agent settled it meanwhile, or the ledger refuses it:
			// said, and not asked again until the Trace changes.
			sw.Unreadable = append(sw.Unreadable, fmt.Sprintf("authorization %s: %s", b.auth.Nonce, refused.Message))
		default:
			complete = false
			a.cfg.Logger.Warn("a settlement of the Trace could not be recorded; it is read again at the next sweep (authorize_payment, check_before_pay)",
				"nonce", b.auth.Nonce, "run", b.ev.Run, "line", b.ev.Line, "err", err)
		}
	}
	for _, m := range sw.Unreadable {
		a.cfg.Logger.Warn("a settlement of the Trace is not recorded", "why", m)
	}
	if complete {
		st.fp = fp.String()
		swept()
	}
	return sw, false, nil
}

// recordAmbiguity records a settlement of the Trace that binds to no one
// authorization as a finding for a person, once per ambiguity (the log
// keeps one record of each; this process remembers those it saw), and
// tells the reviewers (Config.Ambiguous). False: it could not be recorded
// and is tried again at the next sweep.
func (a *Authorizer) recordAmbiguity(ctx context.Context, am reviewlog.Ambiguity) bool {
	key := reviewlog.AmbiguityKey(am.Kind, am.Nonces, am.Transactions)
	st := a.trace
	if st.ambiguous[key] {
		return true
	}
	recorded, err := a.cfg.Engine.RecordAmbiguity(ctx, am)
	if err != nil {
		a.cfg.Logger.Warn("a settlement of the Trace bound to no one authorization could not be recorded as a finding; it is tried again at the next sweep",
			"why", am.Text, "err", err)
		return false
	}
	st.ambiguous[key] = true
	if recorded {
		a.cfg.Logger.Warn("a settlement of the Trace is not bound to an authorization: recorded as a finding for the reviewers", "why", am.Text, "key", key)
		if a.cfg.Ambiguous != nil {
			am.Key = key
			a.cfg.Ambiguous(am)
		}
	}
	return true
}

// SettleFromTraceSeen is SettleFromTrace after a decision that listed the
// Trace through the catalog (check_before_pay): while no listing since the
// last complete sweep saw a run file change (Config.TraceChanges) and this
// process recorded no settlement, it reads nothing at all — not even the
// events directory — so a decision over an unchanged Trace costs nothing
// more at any size of root. When the Trace changed, only the bytes
// appended to a run since the last sweep are read. Without TraceChanges it
// is SettleFromTrace.
//
// The first sweep of a process (none completed yet) reads every run file
// whole — 1.7 GB on a root of 3M events — so it runs after the caller's
// answer instead of before it: SettleFromTraceSeen starts it and returns
// (one at a time; Close ends it). A decision made meanwhile sees the
// authorizations it has not bound yet still open, which can only add a
// review: binding a settlement closes an open hold and never adds to what
// a decision counts. authorize_payment's sweep (SettleFromTrace) stays
// before its answer.
func (a *Authorizer) SettleFromTraceSeen(ctx context.Context) (TraceSweep, error) {
	st := a.trace
	if a.cfg.TraceChanges != nil && st.swept.Load() && st.sweptChanges.Load() == a.cfg.TraceChanges() && st.sweptGen.Load() == st.gen.Load() {
		return TraceSweep{}, nil
	}
	if !st.swept.Load() {
		if st.first.CompareAndSwap(false, true) {
			bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
			stop := context.AfterFunc(a.closing, cancel)
			started := a.background(func() {
				defer st.first.Store(false)
				defer stop()
				defer cancel()
				if _, err := a.SettleFromTrace(bg); err != nil {
					a.cfg.Logger.Warn("the Trace's settlements could not be read", "err", err)
				}
			})
			if !started {
				stop()
				cancel()
				st.first.Store(false)
			}
		}
		return TraceSweep{}, nil
	}
	return a.SettleFromTrace(ctx)
}

type traceBinding struct {
	auth     reviewlog.AuthorizedLine
	ev       traceSettlement
	by       string
	findings []string
}

type runOp struct{ run, op string }

// bindTrace binds the Trace's settlement events to pending authorizations:
// by nonce first, then by terms where unique. txs maps each transaction
// already recorded to the nonce it settled.
func bindTrace(pending []reviewlog.AuthorizedLine, runs map[string]traceRun, txs map[string]string) ([]traceBinding, []reviewlog.Ambiguity) {
	names := make([]string, 0, len(runs))
	for n := range runs {
		names = append(names, n)
	}
	sort.Strings(names)
	byNonce := map[string][]runOp{}
	withNonce := map[runOp]bool{}
	var all []traceSettlement
	for _, n := range names {
		r := runs[n]
		for op, ns := range r.Nonces {
			for _, nonce := range ns {
				byNonce[nonce] = append(byNonce[nonce], runOp{n, op})
			}
			withNonce[runOp{n, op}] = true
		}
		all = append(all, r.Settlements...)
	}
	sort.SliceStable(all, func(i, j int) bool {
		if !all[i].At.Equal(all[j].At) {
			return all[i].At.Before(all[j].At)
		}
		if all[i].Run != all[j].Run {
			return all[i].Run < all[j].Run
		}
		return all[i].Line < all[j].Line
	})
	var out []traceBinding
	var ambiguous []reviewlog.Ambiguity
	// fits[tx] are the authorizations a terms-matched transaction fits.
	type fit struct {
		auth reviewlog.AuthorizedLine
		ev   traceSettlement
	}
	fits := map[string][]fit{}
	authTxs := map[string]map[string]bool{}
	// A transaction bound by a nonce is no candidate for another
	// authorization's terms.
	boundTx := map[string]bool{}
	for _, au := range pending {
		for _, ro := range byNonce[strings.ToLower(au.Nonce)] {
			for _, ev := range all {
				if ev.Run == ro.run && ev.Operation == ro.op {
					boundTx[strings.ToLower(txOf(ev))] = true
				}
			}
		}
	}
	for _, au := range pending {
		nonce := strings.ToLower(au.Nonce)
		if ops, ok := byNonce[nonce]; ok {
			var evs []traceSettlement
			for _, ev := range all {
				for _, ro := range ops {
					if ev.Run == ro.run && ev.Operation == ro.op {
						evs = append(evs, ev)
					}
				}
			}
			if len(evs) == 0 {
				continue // its operation has not settled yet
			}
			ev := evs[0]
			findings := eventFindings(ev, au)
			tx := strings.ToLower(txOf(ev))
			for _, o := range evs[1:] {
				if ot := strings.ToLower(txOf(o)); ot != tx {
					findings = append(findings, fmt.Sprintf("transaction: the Trace's settlements of this nonce name %s (run %s, line %d) and %s (run %s, line %d)",
						clip(tx), ev.Run, ev.Line, clip(ot), o.Run, o.Line))
					break
				}
			}
			if other, ok := txs[tx]; ok && tx != "" {
				findings = append(findings, fmt.Sprintf("transaction: %s is already recorded as the settlement of authorization %s", clip(tx), other))
			}
			out = append(out, traceBinding{auth: au, ev: ev, by: "nonce", findings: findings})
			continue
		}
		if au.Resource == "" {
			continue // no resource to bind its terms by
		}
		vb, ok := unixTime(au.ValidBefore)
		signed, err := time.Parse(time.RFC3339Nano, au.At)
		if !ok || err != nil {
			continue
		}
		for _, ev := range all {
			tx := strings.ToLower(txOf(ev))
			if withNonce[runOp{ev.Run, ev.Operation}] || tx == "" || txs[tx] != "" || boundTx[tx] || ev.At.Before(signed) || ev.At.After(vb.Add(TraceSettleGrace)) ||
				len(eventFindings(ev, au)) > 0 || !strings.EqualFold(payerOf(ev), au.From) || ev.Resource == "" {
				continue
			}
			if authTxs[nonce] == nil {
				authTxs[nonce] = map[string]bool{}
			}
			if !authTxs[nonce][tx] {
				authTxs[nonce][tx] = true
				fits[tx] = append(fits[tx], fit{au, ev})
			}
		}
	}
	var txList []string
	for tx := range fits {
		txList = append(txList, tx)
	}
	sort.Strings(txList)
	for _, tx := range txList {
		f := fits[tx]
		nonce := strings.ToLower(f[0].auth.Nonce)
		switch {
		case len(f) > 1:
			var ns []string
			for _, x := range f {
				ns = append(ns, strings.ToLower(x.auth.Nonce))
			}
			ambiguous = append(ambiguous, reviewlog.Ambiguity{Kind: reviewlog.AmbiguousSettlement, Nonces: ns, Transactions: []string{tx}, TraceRun: f[0].ev.Run, TraceLine: f[0].ev.Line,
				Text: fmt.Sprintf("the Trace's settlement %s (run %s, line %d) has the terms of %d authorizations (%s): none is bound; hand the settlement in with record_receipt",
					tx, f[0].ev.Run, f[0].ev.Line, len(f), strings.Join(ns, ", "))})
		case len(authTxs[nonce]) > 1:
			var ts []string
			for t := range authTxs[nonce] {
				ts = append(ts, t)
			}
			sort.Strings(ts)
			ambiguous = append(ambiguous, reviewlog.Ambiguity{Kind: reviewlog.AmbiguousAuthorization, Nonces: []string{nonce}, Transactions: ts, TraceRun: f[0].ev.Run, TraceLine: f[0].ev.Line,
				Text: fmt.Sprintf("authorization %s has the terms of %d settlements of the Trace (%s): none is bound; hand the settlement in with record_receipt",
					f[0].auth.Nonce, len(ts), strings.Join(ts, ", "))})
			delete(authTxs, nonce) // said once
		case len(authTxs[nonce]) == 1:
			out = append(out, traceBinding{auth: f[0].auth, ev: f[0].ev, by: "terms"})
		}
	}
	return out, ambiguous
}

// eventFindings compares the terms a settlement event names with the
// authorization's: each difference names the field.
func eventFindings(ev traceSettlement, au reviewlog.AuthorizedLine) []string {
	var out []string
	where := fmt.Sprintf("the Trace's settlement (run %s, line %d)", ev.Run, ev.Line)
	if !strings.EqualFold(ev.PayTo, au.To) {
		out = append(out, fmt.Sprintf("payTo: %s pays %q, the authorization %s", where, clip(ev.PayTo), au.To))
	}
	if a, ok := new(big.Int).SetString(ev.Amount, 10); !ok || a.String() != au.Value {
		out = append(out, fmt.Sprintf("amount: %s names %q atomic units, the authorization %s", where, clip(ev.Amount), au.Value))
	}
	if !strings.EqualFold(ev.Asset, au.Token) {
		out = append(out, fmt.Sprintf("asset: %s names %q, the authorization %s", where, clip(ev.Asset), au.Token))
	}
	if n, err := guard.NetworkCAIP2(ev.Network); err != nil || n != au.Network {
		out = append(out, fmt.Sprintf("network: %s names %q for the requirements, the authorization %s", where, clip(ev.Network), au.Network))
	}
	if au.Resource != "" && ev.Resource != "" && !x402.SameResource(au.Resource, ev.Resource) {
		out = append(out, fmt.Sprintf("resource: %s is for %q, the authorization paid for %q", where, clip(ev.Resource), clip(au.Resource)))
	}
	if signed, err := time.Parse(time.RFC3339Nano, au.At); err == nil && ev.At.Before(signed) {
		out = append(out, fmt.Sprintf("occurred_at: %s is dated %s, before the authorization was signed (%s)", where, clip(ev.OccurredAt), au.At))
	}
	return out
}

func txOf(ev traceSettlement) string {
	s, err := x402.ParseSettlement(ev.Settle)
	if err != nil {
		return ""
	}
	return s.Transaction
}

func payerOf(ev traceSettlement) string {
	s, err := x402.ParseSettlement(ev.Settle)
	if err != nil {
		return ""
	}
	return s.Payer
}

func unixTime(s string) (time.Time, bool) {
	n, ok := new(big.Int).SetString(s, 10)
	if !ok || !n.IsInt64() {
		return time.Time{}, false
	}
	return time.Unix(n.Int64(), 0), true
}
