package main

import (
	"context"
	"flag"
	"log/slog"
	"strings"
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
// keeps it by default (serverParamsKeys). Under no key found here that
// verifies the ledger, the entries are not trusted and the view says so
// (Problems), listing none.
func committedView(ctx context.Context, st *app.Stack, signedAs string, pol *guard.Config) (reviewlog.ReservationView, error) {
	keys, err := foundParamsKeys()
	if err != nil {
		return reviewlog.ReservationView{}, err
	}
	if len(keys) == 0 {
		return unsealedView(ctx, st, signedAs)
	}
	quiet := slog.New(slog.DiscardHandler)
	var last []string
	for _, key := range keys {
		eng, err := engine.New(engine.Config{Policy: pol, Templates: st.Templates(), History: st.Catalog(), Log: st.Log(),
			Chains: &reviewlog.Chains{Tenant: signedAs}, ParamsKey: key, Logger: quiet})
		if err != nil {
			return reviewlog.ReservationView{}, err
		}
		infos, problems, err := eng.Reservations(ctx)
		if err != nil {
			return reviewlog.ReservationView{}, err
		}
		if len(problems) == 0 {
			v := reviewlog.ReservationView{Held: []reviewlog.Reservation{}}
			for _, i := range infos {
				v.Held = append(v.Held, reviewlog.Reservation{ReceiptID: i.ReceiptID, Caller: i.Caller, PayTo: i.PayTo, Host: i.Host, Resource: i.Resource,
					Atomic: i.AmountAtomic, Asset: i.Asset, Until: i.Until, Open: i.Open, ReviewID: i.ReviewID, At: i.At})
			}
			return v, nil
		}
		last = problems
	}
	return reviewlog.ReservationView{Held: []reviewlog.Reservation{}, Problems: []string{"the spend ledger does not verify under a params key found here (params-key.pem, signing-key.pem): " + strings.Join(last, "; ")}}, nil
}

// unsealedView is the ledger read here without the server's key (none is
// found where the server keeps it by default): the entries as their lines
// say, their links and order checked, their seals not — as review show
// read reservation records against the chain before the ledger. A break in
// the lines is a problem; unchecked seals are not.
func unsealedView(ctx context.Context, st *app.Stack, signedAs string) (reviewlog.ReservationView, error) {
	var raws []ledger.Raw
	err := st.Store().View(ctx, func(r reviewlog.Reader) error {
		var err error
		raws, err = r.Ledger().Since(ctx, nil)
		return err
	})
	if err != nil {
		return reviewlog.ReservationView{}, err
	}
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
			Atomic: en.Atomic, Asset: en.Asset, Until: until, Open: en.Open, ReviewID: en.Review, At: en.At})
	}
	return v, nil
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
