package main

import (
	"context"
	"log/slog"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// committedView is what the spend ledger holds now that the Trace does not
// show yet, read as the server reads it (engine.Reservations): every entry
// verified under the server's params key, looked for where the server
// keeps it by default (serverParamsKeys). Under no key found here that
// verifies the ledger, the entries are not trusted and the view says so
// (Problems), listing none.
func committedView(ctx context.Context, st *app.Stack, signedAs string, pol *guard.Config) (reviewlog.ReservationView, error) {
	keys, err := serverParamsKeys()
	if err != nil {
		return reviewlog.ReservationView{}, err
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
