// Package app assembles the product: the Trace root and its catalog, the
// guard's store, review log and decision chains, the signer, the decision
// engine with its notifier, the payment authorizer, and tenants. Commands
// turn their flags into a Config and call Open; the MCP and HTTP adapters,
// the guard proxy and the reviewer console take what they serve from the
// Stack it returns.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/haia-trace-mcp/haia-trace-mcp/app/catalog"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/policy"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/evmrpc"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/notify"
)

// Config is everything a Stack is assembled from, already chosen: the
// caller resolves defaults and the environment.
type Config struct {
	// Dir is the Trace root.
	Dir string
	// Tenant names the tenant this stack serves ("" without tenants): its
	// policy layers apply and it is scope.tenant in decision receipts.
	Tenant string
	// TemplatesDir is the operator's templates ("" : the root's templates/).
	TemplatesDir string
	// IndexMaxBytes bounds the run index's memory (0: the default).
	IndexMaxBytes int64
	// IndexSaveDelay is a test hook (catalog.Config.SaveDelay).
	IndexSaveDelay time.Duration
	// ProgressOf, when set, gives for a tenant ("" without tenants) what
	// is told how a refresh of its run index that must read runs goes (a
	// cold index on a terminal).
	ProgressOf func(tenant string) func(done, total int)
	// Reading, when set, is told before a refresh of the run index reads
	// run files about how many bytes it will read, and what it returns is
	// called once they are read (catalog.Config.Reading): a server makes
	// its collector lazier for a cold read. It may be called by several
	// tenants' indexes at once.
	Reading func(bytes int64) (done func())
	// ReadOnly opens the catalog alone: no policy, key, store or reviewers
	// are opened, and nothing is written.
	ReadOnly bool
	// GuardConfig is the policy file ("": the one beside the root when it
	// exists, else the built-in defaults).
	GuardConfig string
	// Signing says how decisions are signed.
	Signing Signing
	// ReviewersPath is the trusted reviewers file (read, never written).
	ReviewersPath string
	// Store is where the guard's state lives: "file:" or a postgres:// URL
	// (with Tenant, one naming each tenant's database: TenantStore).
	Store string
	// Payer, when set, signs the x402 payments the engine allows.
	Payer x402.Signer
	// ChainRPC, when set, reads the asset contracts of expired
	// authorizations (--chain-rpc).
	ChainRPC *evmrpc.Endpoints
	// Notifier, when it has members, is told of each opened review.
	Notifier *notify.Group
	// Integrity counts integrity warnings; nil gives the stack its own.
	// Tenants share one.
	Integrity prometheus.Counter
	// Replica names this process in the notification outbox's claims.
	Replica string
	Logger  *slog.Logger
	Now     func() time.Time

	// Tool opens the stack as the operator's commands use it (review,
	// status, audit, authorization show, review watch) instead of as the
	// server serves it: the same store, its review log opened with the
	// server's options (the trusted reviewers' keys, passkeys and grants,
	// the policy's reviewTtlMinutes, the tenant), under the policy the
	// server recorded in the store. No signing key is opened and no engine
	// built, and opening writes nothing. Dir must be a Trace root (Check).
	Tool bool
	// LockWait bounds how long a write waits for the review log's lock
	// (0: the log's default).
	LockWait time.Duration
	// ServerKeys, when set, are the only keys the server's signatures are
	// verified against (audit --keyring); nil reads the store's keyring.
	ServerKeys noa.Keyring
}

// Stack is one Trace root served: its catalog, and unless read-only its
// guard (store, review log, chains, engine, payments).
type Stack struct {
	cfg       Config
	root      *Root
	templates *receipt.TemplateSet
	catalog   *catalog.Catalog
	// state is guard/, where the server saves its run index (nil: not).
	state *confined.Dir
	// The guard; nil when read-only.
	engine    *engine.Engine
	payments  *payment.Authorizer
	log       *reviewlog.Log
	chains    *reviewlog.Chains
	store     reviewlog.Store
	integrity prometheus.Counter
	paramsKey []byte
	reviewURL atomic.Pointer[func(string) string]
	// tenant is the tenant the stack serves: cfg.Tenant, or for a tool
	// the one the server recorded in the store.
	tenant string
	// policy is the policy a tool goes by (the engine holds the server's);
	// policyKnown is false when the server's could not be known.
	policy      *guard.Config
	policyKnown bool
	// recorded is the store's record of the policy in effect, as a tool
	// read it (nil when none).
	recorded *reviewlog.PolicyRecord
	// dispatch delivers the outbox's opened reviews and findings once
	// started (nil without an outbox or a notifier).
	dispatch func(ctx context.Context)
	// findingWake wakes the file store's outbox of findings (nil: the
	// store has none); outboxMade says it has been read once.
	findingWake chan struct{}
	// Of the file outbox's dispatcher alone: how far it read the log, the
	// findings not told yet, and whether the outbox file was read once.
	findingCur reviewlog.LogCursor
	findingDue []string
	outboxMade bool
	started    bool
	cancel     context.CancelFunc
	// warmCancel stops Warm's reading.
	warmCancel context.CancelFunc
	wg         sync.WaitGroup
	closeOnce  sync.Once
}

// Open opens cfg.Dir as a Trace root and assembles its stack. On error
// nothing stays open.
func Open(ctx context.Context, cfg Config) (st *Stack, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Store == "" {
		cfg.Store = "file:"
	}
	logger := cfg.Logger
	root, err := OpenRoot(cfg.Dir)
	if err != nil {
		return nil, err
	}
	opened := &Stack{cfg: cfg, root: root, tenant: cfg.Tenant}
	st = opened
	defer func() {
		// (Every return below that fails sets st to nil: what was opened
		// is closed through opened.)
		if err != nil {
			opened.Close()
			st = nil
		}
	}()
	if cfg.Tool {
		// A wrong folder must not look like an empty queue.
		if err := root.Check(); err != nil {
			return nil, err
		}
	}
	if !root.Events().Exists() {
		logger.Info("events/ does not exist yet: nothing to list until a recorder creates it", "root", root.Path())
	}
	if st.templates, err = root.Templates(cfg.TemplatesDir, logger); err != nil {
		return nil, err
	}
	// One catalog per root: the read tools, the engine's history and the
	// console's explanations all read runs through it.
	var progress func(done, total int)
	if cfg.ProgressOf != nil {
		progress = cfg.ProgressOf(cfg.Tenant)
	}
	// The server saves its run index in guard/ so that a restart answers
	// from it (checked against every run file); commands read runs only.
	var state *confined.Dir
	if !cfg.ReadOnly && !cfg.Tool {
		if state, err = root.Dir().OpenDirLazy("guard"); err != nil {
			return nil, fmt.Errorf("trace root %s: guard directory: %w", root.Path(), err)
		}
		st.state = state
	}
	if st.catalog, err = root.Catalog(st.templates, cfg.IndexMaxBytes, cfg.IndexSaveDelay, state, logger, progress, cfg.Reading); err != nil {
		return nil, err
	}
	if cfg.ReadOnly {
		return st, nil
	}
	if cfg.Tool {
		return st, st.openTool(ctx)
	}
	return st, st.openGuard(ctx)
}

// openStore opens the guard's store of the stack's tenant.
func (st *Stack) openStore(ctx context.Context) error {
	spec, err := TenantStore(st.cfg.Store, st.cfg.Tenant)
	if err != nil {
		return err
	}
	if st.store, err = OpenStore(ctx, st.root.Dir(), spec); err != nil {
		return err
	}
	return nil
}

// logOptions are the review log's options for the stack's tenant under
// pol: the server's and every command's alike. A tenant's log trusts only
// the reviewers the file grants the tenant: a decision by anyone else
// counts for neither the engine, nor the console, nor get_review_status,
// nor the review commands, and the log refuses to write it.
func (st *Stack) logOptions(pol *guard.Config) reviewlog.Options {
	reviewers := st.cfg.ReviewersPath
	return reviewlog.Options{ReviewTTL: pol.ReviewTTL, LockWait: st.cfg.LockWait, ServerKeys: st.cfg.ServerKeys,
		Reviewers: func() (reviewlog.Reviewers, error) { return reviewlog.LoadReviewers(reviewers) },
		Passkeys:  func() (reviewlog.Passkeys, error) { return reviewlog.LoadPasskeys(reviewers) },
		Tenant:    st.tenant,
		Grants:    func() (reviewlog.Grants, error) { return reviewlog.LoadGrants(reviewers) },
		Trust:     func() (reviewlog.ReviewerTrust, error) { return reviewlog.LoadReviewerTrust(reviewers, "") }}
}

// openTool opens the store, the policy the server recorded there and the
// review log, for a command (see Config.Tool).
func (st *Stack) openTool(ctx context.Context) error {
	cfg := st.cfg
	if err := st.openStore(ctx); err != nil {
		return err
	}
	rec, recorded, err := RecordedPolicy(ctx, st.store)
	if err != nil {
		return err
	}
	if recorded {
		st.recorded = &rec
		// The server serving this root as a tenant said so: its log is
		// read, and written, as that tenant's.
		switch {
		case rec.Tenant == "":
		case st.tenant == "":
			st.tenant = rec.Tenant
		case st.tenant != rec.Tenant:
			return &ConfigError{Err: fmt.Errorf("the server serves this store as tenant %q (recorded at %s), not %q", rec.Tenant, rec.At, st.tenant)}
		}
	}
	pol, known, err := toolPolicy(rec, recorded, cfg.GuardConfig)
	if err != nil {
		return err
	}
	if st.tenant != "" {
		pol = pol.ForTenant(st.tenant)
	}
	st.policy, st.policyKnown = pol, known
	st.log = reviewlog.OpenStore(st.store, st.logOptions(pol))
	return nil
}

// openGuard loads the policy, its custom rules and the signing setup, opens
// the store and builds the engine.
func (st *Stack) openGuard(ctx context.Context) error {
	cfg, logger := st.cfg, st.cfg.Logger
	pol, err := LoadPolicy(cfg.GuardConfig, st.root.Path(), logger)
	if err != nil {
		return err
	}
	rules, err := LoadRules(pol, "refusing to start", logger)
	if err != nil {
		return err
	}
	signer, paramsKey, err := cfg.Signing.Open(logger)
	if err != nil {
		return err
	}
	st.chains = &reviewlog.Chains{Signer: signer, Tenant: cfg.Signing.Tenant}
	st.paramsKey = paramsKey
	if err := st.openStore(ctx); err != nil {
		return err
	}
	logger.Info("guard store", "store", st.store.Describe())
	if o, ok := st.store.(interface {
		OwnsTables(context.Context) (bool, error)
	}); ok {
		// A runtime role that owns the tables can disable the triggers that
		// keep its records fixed: say so once, at start (docs/store.md, Roles).
		if owns, err := o.OwnsTables(ctx); err == nil && owns {
			logger.Warn("the server's PostgreSQL role owns the guard's tables (or is a superuser): it could disable the triggers that keep its records fixed; run store migrate --grant ROLE as the owner and serve as ROLE (docs/store.md, Roles)")
		}
	}
	// The policy is recorded in the store when the server serves (Start):
	// a start refused after this point leaves the store as it was.
	st.policy, st.policyKnown = pol, true
	noteRotation(ctx, st.store, st.chains, logger)
	if _, err := reviewlog.LoadReviewers(cfg.ReviewersPath); err != nil {
		// Not fatal: a root from nothing has no reviewer yet. Every human
		// decision reads unverified until one is trusted.
		logger.Warn("no trusted reviewers: human decisions will read unverified until one is added (haia-trace-mcp reviewer init)", "reviewers", cfg.ReviewersPath, "err", err)
	} else {
		logger.Info("trusted reviewers file", "reviewers", cfg.ReviewersPath)
	}
	if cfg.Payer != nil {
		logger.Info("x402 payments are signed here (authorize_payment)", "payer", cfg.Payer.Address().Hex(), "max_authorization_seconds", pol.MaxAuthorizationSeconds)
	}
	st.log = reviewlog.OpenStore(st.store, st.logOptions(pol))
	if cfg.Tenant != "" {
		pol = pol.ForTenant(cfg.Tenant)
		st.chains.Tenant = cfg.Tenant
	}
	st.integrity = cfg.Integrity
	if st.integrity == nil {
		st.integrity = NewIntegrityCounter()
	}
	ec := engine.Config{
		Notify:      st.notifier(ctx, pol),
		ReviewURL:   st.reviewPage,
		OnIntegrity: st.integrity.Inc,
		Policy:      pol,
		Rules:       rules,
		Templates:   st.templates,
		History:     st.catalog,
		Log:         st.log,
		Chains:      st.chains,
		ParamsKey:   paramsKey,
		Now:         cfg.Now,
		Logger:      logger,
	}
	if cfg.ChainRPC.Len() > 0 {
		ec.Authorizations = cfg.ChainRPC
		for network, host := range cfg.ChainRPC.Networks() {
			logger.Info("expired authorizations are checked on chain", "network", network, "endpoint", host)
		}
	}
	if st.engine, err = engine.New(ec); err != nil {
		return err
	}
	logger.Info("guard policy loaded", "source", pol.Source, "history_templates", strings.Join(pol.HistoryTemplates, ","),
		"unreadable_history", pol.UnreadableHistory, "unattributable_history", pol.UnattributableHistory)
	if cfg.Payer != nil {
		findings, ambiguous := st.findingNotifier()
		if st.payments, err = payment.New(payment.Config{Engine: st.engine, Signer: cfg.Payer, Events: st.catalog.Events(), State: st.state, TraceChanges: st.catalog.Changes, Logger: logger,
			Findings: findings, Ambiguous: ambiguous}); err != nil {
			return err
		}
	}
	return nil
}

// notifier is the engine's hook for opened reviews: nil without a
// notifier; with a store that dispatches through an outbox
// (OpenedDispatcher), the outbox delivers and the engine's hook is nil.
// The outbox delivers the findings too (settlements with findings,
// ambiguities: NotificationsDispatcher).
func (st *Stack) notifier(ctx context.Context, pol *guard.Config) func(reviewlog.Review) {
	g, logger, tenant := st.cfg.Notifier, st.cfg.Logger, st.cfg.Tenant
	if g == nil || g.Len() == 0 {
		return nil
	}
	deliver := func(r reviewlog.Review) {
		// The reviewer must know which tenant's queue the review is in.
		m, err := notify.NewMessage(notify.EventOpened, struct {
			reviewlog.Review
			Tenant string `json:"tenant,omitempty"`
		}{r, tenant})
		if err != nil {
			logger.Error("notification not sent", "review_id", r.ID, "err", err)
			return
		}
		g.Notify(m)
	}
	if m, ok := st.store.(FindingMarks); ok {
		// Findings go through the file outbox; opened reviews are told by
		// the engine that opened them, at once.
		st.findingWake = make(chan struct{}, 1)
		st.dispatch = func(dctx context.Context) { st.dispatchFindings(dctx, m) }
		return deliver
	}
	d, ok := st.store.(OpenedDispatcher)
	if !ok {
		return deliver
	}
	// The outbox is claimed from when the server serves (Start).
	st.dispatch = func(dctx context.Context) {
		d.DispatchOpened(dctx, st.cfg.Replica, func(ctx context.Context, id string) error {
			if strings.HasPrefix(id, reviewlog.NotifySettlement) || strings.HasPrefix(id, reviewlog.NotifyAmbiguity) {
				return st.deliverFinding(ctx, id)
			}
			r, err := st.log.Get(ctx, id)
			if err != nil {
				return err
			}
			if a, ok := pol.Assets.Lookup(r.Asset); ok {
				r.AssetSymbol = a.Symbol
			}
			r.ReviewURL = st.reviewPage(r.ID)
			deliver(r)
			return nil
		}, logger)
	}
	return nil
}

// FindingMarks is a store that keeps beside its review log which findings
// were told, as the PostgreSQL store's outbox does (the file store:
// guard/notify-outbox.ndjson, under the log's lock).
type FindingMarks interface {
	ClaimNotifications(ctx context.Context, owner string, due []string, lease time.Duration, now time.Time) (claimed, pending []string, err error)
	MarkNotified(ctx context.Context, owner, id string, now time.Time) error
}

// findingLease is how long a claim on a finding holds: a process that died
// while telling it leaves it to the next after that (as the PostgreSQL
// outbox's claims do).
const findingLease = 2 * time.Minute

// findingPoll is how often the file outbox is read without being woken:
// what another process on the root recorded, and claims that lapsed.
const findingPoll = 30 * time.Second

// dispatchFindings tells each finding the review log records (settlements
// with findings, ambiguities) once, through the file store's outbox: it
// reads the log's new lines, claims what nobody told, delivers each and
// marks it. Woken after each finding this process records and every
// findingPoll; it returns when ctx ends.
func (st *Stack) dispatchFindings(ctx context.Context, m FindingMarks) {
	tick := time.NewTicker(findingPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-st.findingWake:
		case <-tick.C:
		}
		st.findingsPass(ctx, m)
	}
}

// findingsPass is one turn of dispatchFindings. Start takes the first
// before the server serves: a store without the outbox file gets it then,
// with the findings recorded before counted as told, so that none recorded
// from then on is taken for one of those.
func (st *Stack) findingsPass(ctx context.Context, m FindingMarks) {
	logger := st.cfg.Logger
	ids, next, err := st.log.NotificationsSince(ctx, st.findingCur)
	if err != nil {
		if ctx.Err() == nil {
			logger.Warn("notification outbox: the review log could not be read", "err", err)
		}
	} else {
		st.findingCur = next
		st.findingDue = append(st.findingDue, ids...)
	}
	if len(st.findingDue) == 0 && st.outboxMade {
		return
	}
	claimed, pending, err := m.ClaimNotifications(ctx, st.cfg.Replica, st.findingDue, findingLease, st.cfg.Now())
	if err != nil {
		if ctx.Err() == nil {
			logger.Warn("notification outbox", "err", err)
		}
		return
	}
	st.outboxMade = true
	told := map[string]bool{}
	for _, id := range claimed {
		if err := st.deliverFinding(ctx, id); err != nil {
			logger.Warn("notification not delivered; it is tried again after the lease", "id", id, "err", err, "lease", findingLease)
			continue
		}
		if err := m.MarkNotified(ctx, st.cfg.Replica, id, st.cfg.Now()); err != nil {
			logger.Warn("notification delivered but not marked", "id", id, "err", err)
			continue
		}
		told[id] = true
	}
	st.findingDue = st.findingDue[:0]
	for _, id := range pending {
		if !told[id] {
			st.findingDue = append(st.findingDue, id)
		}
	}
}

// wakeFindings has the file outbox read the log now.
func (st *Stack) wakeFindings() {
	select {
	case st.findingWake <- struct{}{}:
	default:
	}
}

// deliverFinding tells the reviewers of the finding the outbox names by id
// (NotifySettlement and a nonce, or NotifyAmbiguity and a key), read from
// the review log. One the log does not hold (any more) is logged and
// counted as told.
func (st *Stack) deliverFinding(ctx context.Context, id string) error {
	g, logger := st.cfg.Notifier, st.cfg.Logger
	var m notify.Message
	var err error
	switch {
	case strings.HasPrefix(id, reviewlog.NotifySettlement):
		nonce := strings.TrimPrefix(id, reviewlog.NotifySettlement)
		sts, rerr := st.log.Settlements(ctx)
		if rerr != nil {
			return rerr
		}
		auths, rerr := st.log.Authorizations(ctx)
		if rerr != nil {
			return rerr
		}
		var s *reviewlog.SettledLine
		for i := range sts {
			if strings.EqualFold(sts[i].Nonce, nonce) {
				s = &sts[i]
			}
		}
		var a *reviewlog.AuthorizedLine
		for i := range auths {
			if strings.EqualFold(auths[i].Nonce, nonce) {
				a = &auths[i]
			}
		}
		if s == nil {
			logger.Warn("notification outbox: the review log holds no settlement of this finding; not told", "id", id)
			return nil
		}
		if a == nil {
			// Told all the same, without the terms the log does not hold.
			a = &reviewlog.AuthorizedLine{}
		}
		m, err = st.settlementMessage(s.Settled, *a)
	case strings.HasPrefix(id, reviewlog.NotifyAmbiguity):
		key := strings.TrimPrefix(id, reviewlog.NotifyAmbiguity)
		ams, rerr := st.log.Ambiguities(ctx)
		if rerr != nil {
			return rerr
		}
		var am *reviewlog.Ambiguity
		for i := range ams {
			if ams[i].Key == key {
				am = &ams[i].Ambiguity
			}
		}
		if am == nil {
			logger.Warn("notification outbox: the review log holds no ambiguity of this finding; not told", "id", id)
			return nil
		}
		m, err = st.ambiguityMessage(*am)
	default:
		logger.Warn("notification outbox: not a finding; not told", "id", id)
		return nil
	}
	if err != nil {
		logger.Error("notification not sent", "id", id, "err", err)
		return nil
	}
	g.Notify(m)
	return nil
}

// findingNotifier is what the payment authorizer calls after it records a
// finding: nil without a notifier, or when the store's outbox delivers
// findings (it reads them from the log); with the file store's outbox, a
// wake of its dispatcher.
func (st *Stack) findingNotifier() (func(reviewlog.Settled, reviewlog.AuthorizedLine), func(reviewlog.Ambiguity)) {
	if st.cfg.Notifier == nil || st.cfg.Notifier.Len() == 0 || st.findingWake == nil {
		return nil, nil
	}
	return func(reviewlog.Settled, reviewlog.AuthorizedLine) { st.wakeFindings() }, func(reviewlog.Ambiguity) { st.wakeFindings() }
}

// settlementMessage is the settlement.finding message of a settlement
// recorded with findings. It names the authorization, its payee and
// amount, the source and each finding (URLs without their query), never a
// key or a signature.
func (st *Stack) settlementMessage(s reviewlog.Settled, a reviewlog.AuthorizedLine) (notify.Message, error) {
	f := notify.SettlementFinding{Nonce: s.Nonce, Source: reviewlog.SourceAgent, Transaction: s.Transaction, Network: s.Network, Payee: a.To,
		Amount: a.Value + " atomic units of " + a.Token, Caller: a.Caller, Tenant: st.cfg.Tenant, AuthorizationReceipt: a.Receipt,
		SettlementReceipt: s.Receipt, HoldKept: s.HoldKept, Findings: append([]string(nil), s.Findings...)}
	if s.Source == reviewlog.SourceTrace && s.Trace != nil {
		f.Source, f.TraceRun, f.TraceOperation, f.TraceLine = reviewlog.SourceTrace, s.Trace.Run, s.Trace.Operation, s.Trace.Line
	}
	if a.Nonce == "" {
		f.Payee, f.Amount = "an address the review log does not hold", "an amount the review log does not hold"
	}
	if key, _, err := guard.AssetKey(a.Network, a.Token); err == nil {
		if as, ok := st.Policy().Assets.Lookup(key); ok && as.Symbol != "" {
			if n, ok := new(big.Int).SetString(a.Value, 10); ok {
				f.Amount = guard.FormatDisplay(n, as.Decimals) + " " + as.Symbol
			}
		}
	}
	return notify.NewSettlementMessage(f)
}

// ambiguityMessage is the settlement.finding message of a settlement of
// the Trace bound to no one authorization.
func (st *Stack) ambiguityMessage(am reviewlog.Ambiguity) (notify.Message, error) {
	return notify.NewAmbiguityMessage(notify.SettlementAmbiguity{Ambiguity: am.Kind, Key: am.Key, Nonces: append([]string(nil), am.Nonces...),
		Transactions: append([]string(nil), am.Transactions...), TraceRun: am.TraceRun, TraceLine: am.TraceLine, Tenant: st.cfg.Tenant, Findings: []string{am.Text}})
}

// Start puts a server's stack to work, once the server serves: it records
// the policy in force in the store (what the review commands and status
// go by) and starts delivering the outbox's opened reviews. A start the
// server refused earlier changed nothing in the store. ctx bounds the
// delivery; Start is a no-op on a tool's or a read-only stack, and after
// the first call.
func (st *Stack) Start(ctx context.Context) error {
	if st.engine == nil || st.started {
		return nil
	}
	st.started = true
	if err := RecordPolicy(ctx, st.store, st.policy, st.tenant, st.cfg.Now(), st.cfg.Logger); err != nil {
		return err
	}
	if m, ok := st.store.(FindingMarks); ok {
		if st.findingWake != nil {
			st.findingsPass(ctx, m)
		} else if _, _, err := m.ClaimNotifications(ctx, st.cfg.Replica, nil, findingLease, st.cfg.Now()); err != nil {
			// Without a notifier the outbox is still kept from the start,
			// so a notifier added later tells what was recorded meanwhile
			// (as PostgreSQL's outbox does).
			return err
		}
	}
	if st.dispatch != nil {
		dctx, cancel := context.WithCancel(ctx)
		st.cancel = cancel
		st.wg.Add(1)
		go func() {
			defer st.wg.Done()
			st.dispatch(dctx)
		}()
	}
	return nil
}

// Warm reads the Trace root's run index in the background, as the first
// question would (Catalog.Warm), so that a server that starts on a large
// root without a saved index reads it before its first question rather
// than during it: Ready says not ready, with how far it went, until it has
// read. The channel returned is closed when it ends. Close stops it (what
// it read is kept by the index's own save).
func (st *Stack) Warm(ctx context.Context) <-chan struct{} {
	ctx, cancel := context.WithCancel(ctx)
	st.warmCancel = cancel
	st.catalog.BeginWarm()
	st.wg.Add(1)
	done := make(chan struct{})
	go func() {
		defer st.wg.Done()
		defer close(done)
		start := time.Now()
		if err := st.catalog.Warm(ctx); err != nil {
			if ctx.Err() == nil {
				// A question reads the root again and says what is wrong.
				st.cfg.Logger.Warn("the Trace root's runs could not be read at the start", "err", err)
			}
			return
		}
		if d := time.Since(start); d >= time.Second {
			st.cfg.Logger.Info("the Trace root's runs are read", "took", d.Round(time.Millisecond))
		}
	}()
	return done
}

// reviewPage is the console's page of a review ("" without a console).
func (st *Stack) reviewPage(id string) string {
	if f := st.reviewURL.Load(); f != nil {
		return (*f)(id)
	}
	return ""
}

// SetReviewURL gives the console's page of a review, for review answers,
// notifications and get_review_status; call it before serving.
func (st *Stack) SetReviewURL(f func(id string) string) {
	if f != nil {
		st.reviewURL.Store(&f)
	}
}

// NewIntegrityCounter counts the times a review's log lines and its signed
// receipts disagreed.
func NewIntegrityCounter() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: "haia_review_integrity_warnings_total",
		Help: "Times a review's log lines and its signed receipts disagreed (an unverified decision, a contradicting line)."})
}

// Root is the stack's Trace root.
func (st *Stack) Root() *Root { return st.root }

// Catalog is the stack's read model.
func (st *Stack) Catalog() *catalog.Catalog { return st.catalog }

// Templates is the template set in force.
func (st *Stack) Templates() *receipt.TemplateSet { return st.templates }

// Engine is the decision engine (nil when read-only).
func (st *Stack) Engine() *engine.Engine { return st.engine }

// Payments signs the x402 payments the engine allows (nil without a payer).
func (st *Stack) Payments() *payment.Authorizer { return st.payments }

// Log is the review log (nil when read-only).
func (st *Stack) Log() *reviewlog.Log { return st.log }

// Chains signs decisions into the decision chains (nil when read-only).
func (st *Stack) Chains() *reviewlog.Chains { return st.chains }

// Store is the guard's store (nil when read-only).
func (st *Stack) Store() reviewlog.Store { return st.store }

// ParamsKey is the key of the receipts' paramsHash (nil when read-only);
// the console derives its session key from it, so replicas share sessions.
func (st *Stack) ParamsKey() []byte { return st.paramsKey }

// ReviewersPath is the trusted reviewers file.
func (st *Stack) ReviewersPath() string { return st.cfg.ReviewersPath }

// Tenant is the tenant the stack serves ("" without tenants): for a tool,
// the one the server recorded in the store when Config names none.
func (st *Stack) Tenant() string { return st.tenant }

// Policy is the policy in force (its tenant's layer composed): the
// server's own, or for a tool the one the server recorded in the store
// (see PolicyKnown); nil when read-only.
func (st *Stack) Policy() *guard.Config {
	if st.engine != nil {
		return st.engine.Policy()
	}
	return st.policy
}

// PolicyKnown says whether Policy is the server's: false for a tool when
// the store records none and no GuardConfig was given, when Policy is the
// built-in defaults, fit for listing but not for deciding.
func (st *Stack) PolicyKnown() bool { return st.policyKnown }

// RecordedPolicy is the store's record of the policy in effect as a tool
// read it, with the last reload the server refused (ok false: none).
func (st *Stack) RecordedPolicy() (reviewlog.PolicyRecord, bool) {
	if st.recorded == nil {
		return reviewlog.PolicyRecord{}, false
	}
	return *st.recorded, true
}

// Metrics are the stack's collectors for /metrics.
func (st *Stack) Metrics() []prometheus.Collector {
	if st.integrity == nil {
		return nil
	}
	return []prometheus.Collector{st.integrity}
}

// Ready says whether the stack can do its work: events/ can be listed (a
// root that cannot be read serves nothing) and, with the guard, the engine
// is ready (its signer, its store, the trusted reviewers) and so is the
// payer. What is not ready is an *engine.NotReadyError.
func (st *Stack) Ready(ctx context.Context) error {
	if _, err := st.catalog.Events().ReadDir(); err != nil {
		return &engine.NotReadyError{Reason: "the events directory cannot be listed", Err: err}
	}
	if warming, done, total := st.catalog.Warming(); warming {
		return &engine.NotReadyError{Reason: fmt.Sprintf("the Trace root's runs are being read since the start (%d of %d read)", done, total)}
	}
	if st.engine == nil {
		return nil
	}
	if err := st.engine.Ready(ctx); err != nil {
		return err
	}
	if st.payments != nil {
		if err := st.payments.Ready(ctx); err != nil {
			return &engine.NotReadyError{Reason: "the payer signer does not answer, so no payment can be authorized", Err: err}
		}
	}
	return nil
}

// Reload re-reads the templates, then the guard policy, the way Open read
// them (on SIGHUP). A template set in which a template the policy reads
// history under cannot be used is refused; a policy that does not load,
// custom rules that do not parse, or a history template that does not
// exist keep the running policy. The log says what happened.
func (st *Stack) Reload(ctx context.Context) {
	logger := st.cfg.Logger
	var historyTemplates []string
	if st.engine != nil {
		historyTemplates = st.engine.Policy().HistoryTemplates
	}
	r, errs := st.templates.Reload(func(r *receipt.Registry) error {
		for _, n := range historyTemplates {
			if _, err := r.Resolve(n); err != nil {
				return fmt.Errorf("history template %s: %w", n, err)
			}
		}
		return nil
	})
	if r == nil {
		logger.Error("SIGHUP: templates not reloaded", "err", errors.Join(errs...))
	} else {
		LogTemplates(r, errs, logger, "SIGHUP: templates reloaded")
	}
	if st.engine != nil {
		st.reloadPolicy(ctx)
	}
}

// reloadPolicy validates the new policy completely before anything
// changes; a valid one is recorded in the store, then put in force.
func (st *Stack) reloadPolicy(ctx context.Context) {
	logger := st.cfg.Logger
	source := st.cfg.GuardConfig
	if source == "" {
		source = PolicyFileBeside(st.root.Path())
	}
	fail := func(err error) {
		logger.Error("SIGHUP: guard policy not reloaded; the running policy stays in force", "running_source", st.policy.Source, "running_sha256", st.policy.Hash, "err", err)
		// status says so too: the refusal is recorded beside the policy
		// in force, until a reload or a start records one again.
		if st.started {
			if rerr := RecordRefusedReload(ctx, st.store, source, err, st.cfg.Now(), logger); rerr != nil {
				logger.Error("SIGHUP: the refused reload could not be recorded in the store", "err", rerr)
			}
		}
	}
	pol, err := LoadPolicy(st.cfg.GuardConfig, st.root.Path(), logger)
	if err != nil {
		fail(err)
		return
	}
	whole := pol
	var rules *policy.Policy
	if rules, err = LoadRules(pol, "keeping the running policy", logger); err != nil {
		fail(err)
		return
	}
	if st.cfg.Tenant != "" {
		pol = pol.ForTenant(st.cfg.Tenant)
	}
	if err := st.engine.CheckPolicy(pol); err != nil {
		fail(err)
		return
	}
	if st.started {
		if err := RecordPolicy(ctx, st.store, whole, st.tenant, st.cfg.Now(), logger); err != nil {
			fail(err)
			return
		}
	}
	if err := st.engine.SetPolicy(pol, rules); err != nil {
		fail(err) // checked above; kept for safety
		return
	}
	st.policy = whole
	st.log.SetReviewTTL(pol.ReviewTTL)
	logger.Info("SIGHUP: guard policy reloaded", "source", pol.Source, "sha256", pol.Hash, "review_ttl", pol.ReviewTTL.String())
}

// Close stops the outbox dispatch and closes the store and the root.
func (st *Stack) Close() {
	st.closeOnce.Do(func() {
		if st.cancel != nil {
			st.cancel()
		}
		if st.warmCancel != nil {
			st.warmCancel()
		}
		st.wg.Wait()
		if st.payments != nil {
			st.payments.Close()
		}
		if st.store != nil {
			st.store.Close()
		}
		if st.catalog != nil {
			st.catalog.WaitSaved()
		}
		if st.state != nil {
			st.state.Close()
		}
		st.root.Close()
	})
}
