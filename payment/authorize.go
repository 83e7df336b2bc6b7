// Package payment is the guard's enforcement point for x402: it reads the
// seller's 402 answer, asks the one decision engine the question
// check_before_pay would ask, and signs the payment only on allow. It holds
// no decision logic of its own.
package payment

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/steptime"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// Config is what an Authorizer needs.
type Config struct {
	Engine *engine.Engine
	Signer x402.Signer
	Now    func() time.Time
	// Events is the Trace's events/ directory, whose settlement events
	// are bound to the authorizations signed (SettleFromTrace); nil reads
	// none.
	Events *confined.Dir
	// State, when set, is where the sweep of Events is saved (SweepFile)
	// for the next process to start from: guard/. Nil saves nothing.
	State *confined.Dir
	// TraceChanges, when set, moves whenever the catalog's listings found a
	// run file of Events changed (catalog.Catalog.Changes): the sweep after
	// a decision (SettleFromTraceSeen) reads nothing while it stays put.
	TraceChanges func() uint64
	// Logger receives what a reading of the Trace could not bind or record;
	// slog.Default() when nil.
	Logger *slog.Logger
	// Findings, when set, is told of each settlement recorded with
	// findings (from either source), after it is recorded: the reviewer's
	// notification. It must not block.
	Findings func(s reviewlog.Settled, a reviewlog.AuthorizedLine)
	// Ambiguous, when set, is told of each settlement of the Trace recorded
	// as bound to no one authorization (reviewlog.Ambiguity), once, after it
	// is recorded. It must not block.
	Ambiguous func(reviewlog.Ambiguity)
}

// Authorizer answers authorize_payment.
type Authorizer struct {
	cfg   Config
	trace *traceState
	// closing ends the sweep running after an answer (see
	// SettleFromTraceSeen) when Close is called; bg waits for it.
	closing context.Context
	close   context.CancelFunc
	bgMu    sync.Mutex
	closed  bool
	bg      sync.WaitGroup
}

// New checks the configuration.
func New(cfg Config) (*Authorizer, error) {
	if cfg.Engine == nil || cfg.Signer == nil {
		return nil, errors.New("payment: an authorizer needs the decision engine and a payer signer")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	closing, stop := context.WithCancel(context.Background())
	return &Authorizer{cfg: cfg, trace: &traceState{runs: map[string]cachedRun{}, ambiguous: map[string]bool{}}, closing: closing, close: stop}, nil
}

// Close ends a sweep of the Trace running after an answer and waits for
// it (what it recorded stays; the rest is read at the next sweep).
func (a *Authorizer) Close() {
	a.bgMu.Lock()
	a.closed = true
	a.bgMu.Unlock()
	a.close()
	a.bg.Wait()
	a.flushSweep()
}

// background runs f on its own goroutine unless Close was called.
func (a *Authorizer) background(f func()) bool {
	a.bgMu.Lock()
	defer a.bgMu.Unlock()
	if a.closed {
		return false
	}
	a.bg.Add(1)
	go func() {
		defer a.bg.Done()
		f()
	}()
	return true
}

// Payer is the address payments are signed from.
func (a *Authorizer) Payer() x402.Address { return a.cfg.Signer.Address() }

// Request is authorize_payment's arguments.
type Request struct {
	// PaymentRequired is the seller's 402 answer: the PaymentRequired
	// object, or the base64 value of its PAYMENT-REQUIRED header.
	PaymentRequired any
	// Resource is the URL the agent requested, or "". When given, the
	// seller's host and duplicate payments are judged on it, and the 402
	// must declare the same resource (see x402.SameResource).
	Resource string
}

// Accepted says which entry of accepts was asked about, as the guard reads it.
type Accepted struct {
	Index   int    `json:"index"`
	Network string `json:"network"`
	Asset   string `json:"asset"`
	Amount  string `json:"amount"`
	Atomic  string `json:"amount_atomic"`
	PayTo   string `json:"pay_to"`
	// Host is the seller's host, judged beside PayTo: the host of the
	// resource the agent requested, else of the one the 402 declares.
	Host string `json:"host"`
}

// Signed is the authorization given on allow.
type Signed struct {
	Payer       string `json:"payer"`
	PayTo       string `json:"pay_to"`
	Value       string `json:"value"`
	ValidAfter  int64  `json:"valid_after"`
	ValidBefore int64  `json:"valid_before"`
	Nonce       string `json:"nonce"`
	// ReceiptID is the receipt that records the authorization.
	ReceiptID string `json:"receipt_id"`
}

// Result is authorize_payment's answer. Payment is set only on allow.
type Result struct {
	Decision  string         `json:"decision"`
	Reasons   []guard.Reason `json:"reasons"`
	ReceiptID string         `json:"receipt_id"`
	ReviewID  string         `json:"review_id,omitempty"`
	// ReviewURL is the console page of the review (with --console-url).
	ReviewURL string   `json:"review_url,omitempty"`
	Accepted  Accepted `json:"accepted"`
	// Reservation is what the allow holds: spend, and a payment open to
	// payTo, until the Trace shows it.
	Reservation   *engine.ReservationInfo `json:"reservation,omitempty"`
	Payment       *x402.Payment           `json:"payment,omitempty"`
	Authorization *Signed                 `json:"authorization,omitempty"`
	// Offer is the seller's signed offer for the entry, as checked before
	// the engine was asked (nil when the 402 carried none).
	Offer *OfferResult `json:"offer,omitempty"`
}

// OfferResult is what was found of the seller's signed offer.
type OfferResult struct {
	// Verified: the signature verified and the terms are the entry's
	// (whether the signer is trusted is the decision's signed_offer reason).
	Verified bool                 `json:"verified"`
	Problem  string               `json:"problem,omitempty"`
	Signer   *x402.ArtifactSigner `json:"signer,omitempty"`
	Terms    *x402.OfferTerms     `json:"terms,omitempty"`
	// Artifact is the offer as the seller sent it.
	Artifact *x402.Artifact `json:"artifact,omitempty"`
}

// RefusedError means nothing was asked or signed; Message is for the caller.
type RefusedError struct{ Message string }

func (e *RefusedError) Error() string { return e.Message }

func refusedf(format string, a ...any) error {
	return &RefusedError{Message: fmt.Sprintf(format, a...)}
}

// Authorize reads the 402, asks the engine, and signs on allow. An answer
// that is not allow carries no signature; an allow whose authorization
// cannot be signed and recorded is an error (no signature leaves).
func (a *Authorizer) Authorize(ctx context.Context, caller string, req Request) (res Result, err error) {
	// At debug level the time of each step is logged, so that where a
	// payment's time goes can be read from a running server.
	clock := steptime.Start(ctx, a.cfg.Logger)
	// signer is the time the signing took, inside decide.
	var signer time.Duration
	defer func() {
		clock.Log(ctx, a.cfg.Logger, "authorize_payment steps", "signer", signer, "decision", res.Decision, "failed", err != nil)
	}()
	// The Trace's settlements are bound first: what they settle is
	// recorded before this decision reads the Trace. A Trace that cannot
	// be read here is the decision's to judge; it is only logged.
	if _, err := a.SettleFromTrace(ctx); err != nil {
		a.cfg.Logger.Warn("the Trace's settlements could not be read", "err", err)
	}
	clock.Step("settle_trace")
	pol := a.cfg.Engine.Policy().For(caller)
	rd, err := read402(req.PaymentRequired, req.Resource, pol, a.cfg.Now(), func() error {
		// What cannot settle is refused before the engine is asked, so that
		// nothing is reserved for it.
		if max := a.cfg.Engine.Policy().MaxAuthorizationSeconds; max > 0 && max < x402.MinAuthorizationSeconds {
			return refusedf("the policy's maxAuthorizationSeconds is %d, and an authorization valid for less than %d seconds cannot settle (the official facilitator refuses a validBefore less than 6 s ahead when it verifies); the operator must raise it; nothing was asked or signed",
				max, x402.MinAuthorizationSeconds)
		}
		return nil
	})
	if err != nil {
		return Result{}, err
	}
	pr, choice, resource, ev, offer := rd.pr, rd.choice, rd.Question.Resource, rd.Question.Offer, rd.Offer
	// The validBefore is chosen before the engine is asked, and sealed
	// with its hold: the authorization signed is valid no later, so that
	// once it has passed the hold can be released if the asset contract
	// says the nonce was never used.
	// One clock reading gives both ends of the window, so its length is
	// exactly what the offer and the policy allow, whatever second the
	// signing falls in.
	clock.Step("read_402")
	maxSeconds := int64(a.cfg.Engine.Policy().MaxAuthorizationSeconds)
	asked := a.cfg.Now()
	before := x402.ValidBeforeFor(choice, asked, maxSeconds)
	offerRaw, seal, err := offerSeal(offer, ev.Signer)
	if err != nil {
		return Result{}, fmt.Errorf("the seller's offer cannot be recorded: %w", err)
	}
	// The authorization is signed inside the engine's section that allows
	// it, and recorded there with the allow (engine.AuthorizationTerms.Sign):
	// the engine decides; this only signs what it allowed.
	var (
		pay   x402.Payment
		terms x402.Terms
	)
	sign := func(ctx context.Context, s engine.Signing) (reviewlog.Authorized, [32]byte, error) {
		began := time.Now()
		defer func() { signer = time.Since(began) }()
		t, err := x402.TermsUntil(choice, a.cfg.Signer.Address(), s.DecisionReceipt, asked, before)
		if err != nil {
			return reviewlog.Authorized{}, [32]byte{}, fmt.Errorf("authorization terms: %w", err)
		}
		sig, err := x402.Sign(ctx, a.cfg.Signer, t)
		if err != nil {
			return reviewlog.Authorized{}, [32]byte{}, err
		}
		p, err := x402.BuildPayment(pr, choice, t, sig)
		if err != nil {
			return reviewlog.Authorized{}, [32]byte{}, err
		}
		pay, terms = p, t
		au := t.Authorization.JSON()
		return reviewlog.Authorized{
			DecisionReceipt: s.DecisionReceipt, ReviewID: s.ReviewID, Network: choice.Network, Token: choice.Token.Hex(),
			Name: t.Domain.Name, Version: t.Domain.Version, From: au.From, To: au.To, Value: au.Value,
			ValidAfter: au.ValidAfter, ValidBefore: au.ValidBefore, Nonce: au.Nonce,
			Signature: "0x" + hex.EncodeToString(sig[:]), Digest: "0x" + hex.EncodeToString(t.Digest[:]), Resource: resource,
			Offer: offerRaw, OfferSigner: ev.Signer, OfferSeal: seal,
		}, t.Digest, nil
	}
	ans, err := a.cfg.Engine.AuthorizeTerms(ctx, caller, rd.Question, engine.AuthorizationTerms{Payer: a.cfg.Signer.Address().Lower(), ValidBefore: time.Unix(before, 0),
		Nonce: func(receiptID string) string { n := x402.NonceFor(receiptID); return "0x" + hex.EncodeToString(n[:]) },
		Sign:  sign})
	if err != nil {
		return Result{}, err
	}
	// decide: the engine's section, with the signature and the
	// authorization's records when it allowed.
	clock.Step("decide")
	res = Result{Decision: ans.Decision, Reasons: ans.Reasons, ReceiptID: ans.ReceiptID, ReviewID: ans.ReviewID, ReviewURL: ans.ReviewURL, Reservation: ans.Reservation,
		Accepted: rd.Accepted, Offer: offer}
	if ans.Decision != guard.Allow {
		return res, nil
	}
	rec := ans.Authorization
	if rec == nil || rec.DecisionReceipt != ans.ReceiptID || rec.Nonce != strings.ToLower(terms.Authorization.JSON().Nonce) {
		// Never expected: an allow the engine gave without the
		// authorization signed in its section.
		return Result{}, &engine.NotRecordedError{Message: fmt.Sprintf("the payment was allowed (receipt %s) but its authorization was not recorded with it, so none is given (fail closed)", ans.ReceiptID),
			Err: errors.New("payment: an allow without its recorded authorization")}
	}
	au := terms.Authorization.JSON()
	res.Payment = &pay
	res.Authorization = &Signed{Payer: au.From, PayTo: au.To, Value: au.Value, ValidAfter: terms.Authorization.ValidAfter.Int64(),
		ValidBefore: terms.Authorization.ValidBefore.Int64(), Nonce: au.Nonce, ReceiptID: rec.Receipt}
	return res, nil
}

// offerEvidence turns the offer check into what the engine judges and
// what the answer shows.
func offerEvidence(oc x402.OfferCheck, index int) (*guard.OfferEvidence, *OfferResult) {
	ev := &guard.OfferEvidence{Carried: oc.Carried, Problem: oc.Problem, Index: index}
	if !oc.Carried {
		return ev, nil
	}
	res := &OfferResult{Verified: oc.Problem == "" && oc.Signer != nil, Problem: oc.Problem, Signer: oc.Signer, Artifact: oc.Offer}
	if oc.Offer != nil {
		t := oc.Terms
		res.Terms = &t
	}
	if s := oc.Signer; s != nil {
		ev.Signer = s.String()
		if s.Address != "" {
			ev.SignerAddress = strings.ToLower(s.Address)
		}
		ev.SignerKID, ev.SignerThumbprint = s.KID, s.Thumbprint
	}
	return ev, res
}

// offerSeal is the offer as the seller sent it, for the record, and the
// seal its receipt signs: the offer's digest and format, the signer
// recorded, and the key that verified it (the JWS key's RFC 7638
// thumbprint, or the address an EIP-712 signature recovers to). Both are
// nil when the 402 carried no offer for the entry.
func offerSeal(o *OfferResult, signer string) (json.RawMessage, *reviewlog.OfferSeal, error) {
	if o == nil || o.Artifact == nil {
		return nil, nil, nil
	}
	raw, err := o.Artifact.Raw()
	if err != nil {
		return nil, nil, err
	}
	d, err := reviewlog.OfferDigest(raw)
	if err != nil {
		return nil, nil, err
	}
	seal := &reviewlog.OfferSeal{Offer: d, Format: o.Artifact.Format, Signer: signer}
	if s := o.Signer; s != nil && signer != "" {
		seal.Key = s.Thumbprint
		if s.Format == x402.FormatEIP712 {
			seal.Key = strings.ToLower(s.Address)
		}
	} else {
		seal.Signer = ""
	}
	return raw, seal, nil
}

// sellerHost is the host judged beside payTo: the host of the URL the
// agent requested, else of the resource the 402 declares (the two agree
// when both are given). Without a host the seller could escape every rule
// by naming a new payTo, so a 402 whose host cannot be read is refused.
func sellerHost(asked, declared string) (string, error) {
	from, what := asked, "the resource you requested"
	if from == "" {
		from, what = declared, "the resource the seller's 402 declares"
	}
	if from == "" {
		return "", refusedf("the seller's 402 declares no resource URL and the call names none, so the seller's host cannot be judged beside its payTo; pass resource (the URL you requested); nothing was asked or signed")
	}
	cp, err := guard.ParseCounterparty(from)
	if err == nil && cp.Kind != guard.KindHost {
		err = errors.New("it is an address, not a URL")
	}
	if err != nil {
		return "", refusedf("%s, %q, names no host that can be judged beside the payTo (%s); pass resource as the http(s) URL you requested; nothing was asked or signed",
			what, clip(from), strings.TrimPrefix(err.Error(), guard.ErrCounterparty.Error()+": "))
	}
	return cp.Value, nil
}

func clip(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}

// Ready checks the payer signer answers (a signer process can stop): a
// readiness probe that signs nothing.
func (a *Authorizer) Ready(ctx context.Context) error {
	if p, ok := a.cfg.Signer.(interface{ Ping(context.Context) error }); ok {
		return p.Ping(ctx)
	}
	return nil
}
