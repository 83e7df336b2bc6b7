package main

import (
	"context"
	"flag"
	"log/slog"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// committedView is what the spend ledger holds now that the Trace does not
// show yet, read as the server reads it (engine.Reservations): every entry
// verified under the server's params key, looked for where the server
// keeps it by default (foundParamsKeys) and chosen as the one that seals
// the ledger. Where no key found here seals it, the entries are listed as
// their lines say (unsealedView).
func committedView(ctx context.Context, st *app.Stack, signedAs string, pol *guard.Config) (reviewlog.ReservationView, error) {
	eng, raws, err := ledgerEngine(ctx, st, signedAs, pol)
	if err != nil {
		return reviewlog.ReservationView{}, err
	}
	if eng == nil {
		return unsealedView(raws, signedAs), nil
	}
	infos, problems, err := eng.Reservations(ctx)
	if err != nil {
		return reviewlog.ReservationView{}, err
	}
	v := reviewlog.ReservationView{Held: []reviewlog.Reservation{}, Problems: problems}
	for _, i := range infos {
		v.Held = append(v.Held, reviewlog.Reservation{ReceiptID: i.ReceiptID, Caller: i.Caller, PayTo: i.PayTo, Host: i.Host, Resource: i.Resource,
			Atomic: i.AmountAtomic, Asset: i.Asset, Until: i.Until, Open: i.Open, ReviewID: i.ReviewID, At: i.At, ValidBefore: i.ValidBefore})
	}
	return v, nil
}

// ledgerEngine is an engine that reads the spend ledger as the server
// does, under the key found here that seals it (see committedView); nil,
// with the ledger's lines, when no key found here seals it.
func ledgerEngine(ctx context.Context, st *app.Stack, signedAs string, pol *guard.Config) (*engine.Engine, []ledger.Raw, error) {
	keys, err := foundParamsKeys()
	if err != nil {
		return nil, nil, err
	}
	var raws []ledger.Raw
	err = st.Store().View(ctx, func(r reviewlog.Reader) error {
		var err error
		raws, err = r.Ledger().Since(ctx, nil)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	// The key the server sealed the ledger with, among those found here.
	var key []byte
	for _, k := range keys {
		if ledger.Sealed(raws, k) {
			key = k
			break
		}
	}
	if key == nil {
		return nil, raws, nil
	}
	quiet := slog.New(slog.DiscardHandler)
	eng, err := engine.New(engine.Config{Policy: pol, Templates: st.Templates(), History: st.Catalog(), Log: st.Log(),
		Chains: &reviewlog.Chains{Tenant: signedAs}, ParamsKey: key, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	return eng, raws, nil
}

// unsealedView is the ledger read here without the server's key (no key
// found where the server keeps it by default seals it): the entries as
// their lines say, their links and order checked, their seals not — as
// review show read reservation records against the chain before the
// ledger; audit, given the server's key, checks the seals. A break in the
// lines is a problem; unchecked seals are not.
func unsealedView(raws []ledger.Raw, signedAs string) reviewlog.ReservationView {
	live, found := ledger.Unsealed(raws, signedAs, time.Now())
	v := reviewlog.ReservationView{Held: []reviewlog.Reservation{}, Problems: found}
	for _, en := range live {
		if en.Kind == ledger.KindGenesis || en.Kind == ledger.KindRelease {
			continue
		}
		until := en.Until
		if en.Kind == ledger.KindAuthorization {
			until = ""
		}
		v.Held = append(v.Held, reviewlog.Reservation{ReceiptID: en.Receipt, Caller: en.Caller, PayTo: en.PayTo, Host: en.Host, Resource: en.Resource,
			Atomic: en.Atomic, Asset: en.Asset, Until: until, Open: en.Open, ReviewID: en.Review, At: en.At, ValidBefore: en.ValidBefore})
	}
	return v
}

// holdUntil says how long a held amount counts, as status and review show
// list it: an authorization with a recorded validBefore is valid until then
// (local time); after it, it stays held until the Trace shows it or the
// server releases it, which it does only when the asset contract says the
// authorization was never used (--chain-rpc): this command does not read
// the chain, so the outcome is unknown here.
func holdUntil(x reviewlog.Reservation, now time.Time) (text string, expired bool) {
	if vb, err := ledger.ParseTime(x.ValidBefore); err == nil {
		local := vb.Local().Format("2006-01-02 15:04:05 MST")
		if now.Before(vb) {
			return "authorization valid until " + local, false
		}
		return "expired, outcome unknown (the authorization was valid until " + local + "; held until the Trace shows it or the server, reading the asset contract through --chain-rpc, finds it was never used)", true
	}
	if x.Until != "" {
		return "until the Trace shows it or " + x.Until, false
	}
	return "until the Trace shows it", false
}

// paramsKeyFlags name the server's params key for a command that verifies
// the spend ledger's seals: read, never created.
type paramsKeyFlags struct {
	keyFile, paramsKeyFile string
}

func (k *paramsKeyFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.keyFile, "key-file", "", "the server's signing key `FILE` (its --key-file), read to check the spend ledger's seals; never created (default: the server's default files)")
	fs.StringVar(&k.paramsKeyFile, "params-key-file", "", "the server's paramsHash key `FILE` (its --params-key-file), read instead of --key-file when the server signs through --signer")
}

// given says whether the flags name a key.
func (k *paramsKeyFlags) given() bool { return k.keyFile != "" || k.paramsKeyFile != "" }

// keys are the params keys to try: the one the flags name, else those of
// the server's default files that exist here.
func (k *paramsKeyFlags) keys() ([][]byte, error) {
	if k.keyFile == "" && k.paramsKeyFile == "" {
		return foundParamsKeys()
	}
	key, err := serverParamsKey(k.keyFile, k.paramsKeyFile)
	if err != nil {
		return nil, err
	}
	return [][]byte{key}, nil
}
