package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// reviewMoot says which of the pending reviews are moot — their question
// would now be answered without review — by asking the engine the server
// runs (engine.Moot, the judgement get_review_status reports), under the
// policy the server recorded, over the Trace as the server reads it. When
// that cannot be known here it returns no verdicts and why: a review is
// never shown moot on a guess.
//
// The reservations that earlier allows hold bear on the judgement, and
// their records are sealed with the server's params key. The key is looked
// for where the server keeps it by default (params-key.pem with a signer
// process, else derived from signing-key.pem); the judgement stands only
// under a key that verifies every reservation held (with none held, the
// key does not matter). signedAs is the tenant the server signs as
// (scope.tenant), which every reservation record of this store names.
func reviewMoot(ctx context.Context, st *app.Stack, signedAs string, reviews []reviewlog.Review) (map[string]bool, string) {
	pending := false
	for _, r := range reviews {
		pending = pending || r.Status == reviewlog.Pending
	}
	if !pending {
		return map[string]bool{}, ""
	}
	if !st.PolicyKnown() {
		return nil, "the policy the server runs with is not recorded in the guard's store, and no --guard-config was given"
	}
	pol := st.Policy()
	quiet := slog.New(slog.DiscardHandler)
	rules, err := app.LoadRules(pol, "cannot judge", quiet)
	if err != nil {
		return nil, err.Error()
	}
	keys, err := serverParamsKeys()
	if err != nil {
		return nil, err.Error()
	}
	var last []string
	for _, key := range keys {
		eng, err := engine.New(engine.Config{Policy: pol, Rules: rules, Templates: st.Templates(), History: st.Catalog(), Log: st.Log(),
			Chains: &reviewlog.Chains{Tenant: signedAs}, ParamsKey: key, Logger: quiet})
		if err != nil {
			return nil, err.Error()
		}
		moot, problems, err := eng.Moot(ctx, reviews)
		if err != nil {
			return nil, err.Error()
		}
		if len(problems) == 0 {
			return moot, ""
		}
		last = problems
	}
	return nil, "the reservations earlier allows hold do not verify under a params key found here (" + strings.Join(last, "; ") + ")"
}

// serverParamsKeys are the params keys the server may run with, from its
// default key files, in the order it would use them; with neither file
// readable, one random key, under which only an empty set of reservations
// verifies.
func serverParamsKeys() ([][]byte, error) {
	keys, err := foundParamsKeys()
	if err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		none := make([]byte, 32)
		if _, err := rand.Read(none); err != nil {
			return nil, err
		}
		keys = append(keys, none)
	}
	return keys, nil
}

// foundParamsKeys are the params keys of the server's default key files
// that exist here, in the order the server would use them.
func foundParamsKeys() ([][]byte, error) {
	var keys [][]byte
	for _, f := range []struct{ flag, name string }{{"--params-key-file", "params-key.pem"}, {"--key-file", "signing-key.pem"}} {
		path, err := defaultKeyPath(f.flag, f.name)
		if err != nil {
			continue
		}
		key, err := noa.LoadKeyFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		keys = append(keys, engine.ParamsKeyFrom(key.Seed()))
	}
	return keys, nil
}
