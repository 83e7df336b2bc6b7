package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// An authorization the server signed holds its payment (ledger
// KindAuthorization) until the Trace shows it. Once its validBefore has
// passed it can never move money again, and if the asset contract says its
// nonce was never used, the payment did not happen: a sealed release
// (ledger.OutcomeUnused) lets the hold go. What the chain says is read
// through the RPC endpoint the operator configured for the network
// (--chain-rpc); without one, or when the endpoint cannot answer, the hold
// keeps counting for its window, as before.
//
// The check runs at the start of a decision, before its locked section: the
// RPC calls are made without the store's lock (bounded by ExpiryBudget), and
// the release is written in a short section of its own that reads the
// ledger again and writes nothing for an entry that stopped counting or
// whose validBefore has not passed. No goroutine writes outside a
// decision.

// ExpirySkew is how long after an authorization's validBefore, by the
// server's clock, the chain is first asked about it: a server clock ahead of
// the chain's (or a block about to be replaced) must not release an
// authorization that can still be used. The endpoint is also asked for its
// newest block, and nothing is released while that block is older than
// validBefore.
const ExpirySkew = 30 * time.Second

// ExpiryBudget bounds the chain reads of one decision, all together.
const ExpiryBudget = 2 * time.Second

// expiryBatch is the most authorizations one decision asks the chain about.
const expiryBatch = 8

// expiryRetry is how long an authorization whose state could not be read
// waits before it is asked about again.
const expiryRetry = 30 * time.Second

// AuthorizationChain reads an EIP-3009 asset contract through the RPC
// endpoint the operator configured for its network.
type AuthorizationChain interface {
	// Endpoint names the host of network's endpoint (for the log: never
	// the URL, which may carry an API key); ok is false when none is
	// configured.
	Endpoint(network string) (host string, ok bool)
	// AuthorizationUsed reads authorizationState(payer, nonce) of the
	// token at the network's newest block. It is an error when the answer
	// is not final: that block's time is before validBefore (the
	// authorization can still be used), the endpoint serves another
	// chain, or its answer cannot be read.
	AuthorizationUsed(ctx context.Context, network, token, payer, nonce string, validBefore time.Time) (bool, error)
}

// AuthorizationTerms are what an allow of Authorize will sign, sealed into
// its ledger entry: the payer, the validBefore, and the EIP-3009 nonce the
// decision's receipt id gives. The authorization signed must not be valid
// after ValidBefore.
type AuthorizationTerms struct {
	// Payer is the signer's address, 0x and 40 hex digits.
	Payer string
	// ValidBefore is the authorization's validBefore (whole seconds).
	ValidBefore time.Time
	// Nonce derives the nonce (0x and 64 hex digits) from the receipt id.
	Nonce func(receiptID string) string
	// Sign, when set, signs the authorization of an allow inside the
	// locked section that allowed it, once the allow's ledger entry is on
	// disk and its decision receipt written: the authorization's receipt
	// and its review log line are then written in that same section and
	// commit with the allow (Answer.Authorization), so that the signature
	// is never given before they are durable and no second section is
	// needed. When Sign fails, the section fails: nothing is recorded,
	// reserved or signed.
	Sign SignFunc
}

// expiryState is what this process remembers between decisions: when each
// authorization whose state could not be read may be asked about again.
type expiryState struct {
	mu    sync.Mutex
	retry map[string]time.Time
}

func (s *expiryState) due(receipt string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.retry[receipt]
	return !ok || !now.Before(t)
}

func (s *expiryState) later(receipt string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.retry == nil {
		s.retry = map[string]time.Time{}
	}
	s.retry[receipt] = now.Add(expiryRetry)
}

func (s *expiryState) forget(receipt string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.retry, receipt)
}

// splitAsset reads an asset key ("eip155:84532/0x…") as its network and
// token contract.
func splitAsset(key string) (network, token string, ok bool) {
	network, token, ok = strings.Cut(key, "/")
	return network, token, ok && strings.HasPrefix(network, "eip155:") && strings.HasPrefix(token, "0x")
}

// expire asks the chain about the authorizations whose validBefore passed
// more than ExpirySkew ago and that still count, and releases those the
// asset contract says were never used. Whatever it cannot learn keeps
// counting; it never fails the decision that runs it.
func (e *Engine) expire(ctx context.Context) {
	now := e.cfg.Now()
	cands := e.book.Expired(now.Add(-ExpirySkew), expiryBatch)
	if len(cands) == 0 {
		return
	}
	rpc, cancel := context.WithTimeout(ctx, ExpiryBudget)
	defer cancel()
	var unused []ledger.Entry
	for _, en := range cands {
		if !e.expiry.due(en.Receipt, now) {
			continue
		}
		network, token, ok := splitAsset(en.Asset)
		var host string
		if ok = ok && e.cfg.Authorizations != nil; ok {
			host, ok = e.cfg.Authorizations.Endpoint(network)
		}
		if !ok {
			// Known to this process only by its window: it counts until
			// then, and status says its outcome is unknown.
			e.book.SetAside(en.Receipt)
			e.cfg.Logger.Info("an expired authorization keeps counting for its window: no --chain-rpc endpoint for its network, so whether it was used cannot be read",
				"decision_receipt", en.Receipt, "asset", en.Asset, "valid_before", en.ValidBefore, "counts_until", en.Until)
			continue
		}
		vb, _ := ledger.ParseTime(en.ValidBefore)
		if rpc.Err() != nil {
			break
		}
		used, err := e.cfg.Authorizations.AuthorizationUsed(rpc, network, token, en.Payer, en.Nonce, vb)
		switch {
		case err != nil:
			e.expiry.later(en.Receipt, now)
			e.cfg.Logger.Warn("the state of an expired authorization could not be read; it keeps counting and is asked about again later",
				"decision_receipt", en.Receipt, "network", network, "endpoint", host, "err", err)
		case used:
			e.expiry.forget(en.Receipt)
			e.book.SetAside(en.Receipt)
			e.cfg.Logger.Info("an expired authorization was used on chain; it counts as a payment for its window",
				"decision_receipt", en.Receipt, "network", network, "endpoint", host, "counts_until", en.Until)
		default:
			unused = append(unused, en)
		}
	}
	if len(unused) == 0 {
		return
	}
	var raws []ledger.Raw
	err := e.cfg.Log.WithLock(ctx, func(tx reviewlog.Tx) error {
		raws = nil
		if err := e.catchUp(ctx, tx.Store); err != nil {
			return err
		}
		var rels []ledger.Entry
		for _, en := range unused {
			cur, counting, ok := e.book.Get(en.Receipt)
			if !ok || !counting || cur.Kind != ledger.KindAuthorization || cur.ValidBefore != en.ValidBefore {
				continue
			}
			// Never before validBefore and the skew, by the section's
			// own clock.
			if vb, err := ledger.ParseTime(cur.ValidBefore); err != nil || tx.At.Before(vb.Add(ExpirySkew)) {
				continue
			}
			rels = append(rels, ledger.Entry{Kind: ledger.KindRelease, At: ledger.FormatTime(tx.At), Caller: cur.Caller,
				Tenant: e.cfg.Chains.Tenant, Target: cur.Receipt, Outcome: ledger.OutcomeUnused})
		}
		var err error
		raws, err = e.appendEntries(ctx, tx.Store, rels)
		return err
	})
	if err != nil {
		// The section wrote nothing: the holds keep counting, and the
		// decision that follows goes by them.
		e.cfg.Logger.Warn("expired, unused authorizations could not be released; they keep counting", "err", err)
		return
	}
	e.committed(raws...)
	for _, en := range unused {
		e.expiry.forget(en.Receipt)
		if _, counting, _ := e.book.Get(en.Receipt); !counting {
			e.cfg.Logger.Info("an expired authorization the asset contract says was never used is released", "decision_receipt", en.Receipt,
				"asset", en.Asset, "valid_before", en.ValidBefore, "caller", en.Caller)
		}
	}
}

// appendEntries seals ens, in order, at the end of the section's lane and
// appends them together (appendEntry appends one: the Book's head moves
// only once the section commits).
func (e *Engine) appendEntries(ctx context.Context, w reviewlog.Writer, ens []ledger.Entry) ([]ledger.Raw, error) {
	if len(ens) == 0 {
		return nil, nil
	}
	app := w.LedgerAppender()
	first, prev := e.book.Next(app.Lane())
	pos := first
	raws := make([]ledger.Raw, 0, len(ens))
	lines := make([][]byte, 0, len(ens))
	for i := range ens {
		en := &ens[i]
		en.Lane, en.Seq, en.Prev = pos.Lane, pos.Seq, prev
		line, err := en.Seal(e.cfg.ParamsKey)
		if err != nil {
			return nil, fmt.Errorf("seal the release of %s: %w", en.Target, err)
		}
		raws = append(raws, ledger.OwnRaw(pos, line, *en))
		lines = append(lines, line)
		pos.Seq++
		pos.Off += int64(len(line)) + 1
		prev = ledger.Hash(line)
	}
	if err := app.Append(ctx, first, lines); err != nil {
		return nil, err
	}
	return raws, nil
}
