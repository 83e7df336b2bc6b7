package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const initDetails = `Makes a Trace root from nothing: DIR (default .trace) with events/ (where recorders
write), templates/ (the operator's own templates) and guard/ (0700, the server's
state); the server's signing key and a reviewer key in their default places (the
user configuration directory, or $HAIA_CONFIG_DIR), the reviewer trusted; and an
example guard policy with every key at its default. Nothing that exists is
overwritten: existing keys are reused, an existing policy file is left alone.
Prints what it made and the next two commands.

exit codes: 0 done, 1 error, 2 usage
`

// exampleConfig is every key of the guard policy at its default.
const exampleConfig = `{
  "allowlist": [],
  "denylist": [],
  "perCounterpartyLimit": {"amount": "5.00", "windowHours": 24},
  "maxOpenPartialPerCounterparty": 0,
  "reviewAbove": "1.00",
  "defaultAsset": "eip155:8453/0x833589fcd6edb6e08f4c7c32d4f71b54bda02913",
  "assets": {"eip155:8453/0x833589fcd6edb6e08f4c7c32d4f71b54bda02913": {"symbol": "USDC", "decimals": 6}},
  "historyTemplates": ["x402-buyer"],
  "unreadableHistory": "review",
  "unattributableHistory": "review",
  "reviewTtlMinutes": 1440,
  "approvalTtlMinutes": 60,
  "rejectionHoldHours": 24,
  "maxPendingReviewsPerCaller": 20
}
`

// defineInit is `init [DIR]`: a Trace root from nothing.
func defineInit(fs *flag.FlagSet) runFunc {
	config := fs.String("config", "", "the example policy `FILE` (default: haia-guard.config.json beside DIR)")
	keyFile := fs.String("key-file", "", keyFileFlagHelp)
	reviewerID := fs.String("reviewer-id", "", "the first reviewer's id (default: the OS user name)")
	reviewerKey := reviewerKeyFlag(fs)
	reviewers := reviewersFlag(fs)
	return func(_ context.Context, env *cmdEnv, pos []string) error {
		return runInit(env.stdout, env.stderr, pos, config, keyFile, reviewerID, reviewerKey, reviewers)
	}
}

func runInit(stdout, stderr io.Writer, pos []string, config, keyFile, reviewerID, reviewerKey, reviewers *string) error {
	dir := ".trace"
	if len(pos) == 1 {
		dir = pos[0]
	}
	fail := func(err error) error {
		fmt.Fprintf(stderr, "haia-trace-mcp init: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fail(err)
	}
	made, err := app.InitRoot(abs)
	if err != nil {
		return fail(err)
	}

	signingKey := *keyFile
	if signingKey == "" {
		if signingKey, err = defaultKeyPath("--key-file", "signing-key.pem"); err != nil {
			return fail(err)
		}
	}
	if _, created, err := noa.LoadOrCreateKeyFile(signingKey); err != nil {
		return fail(fmt.Errorf("--key-file: %w", err))
	} else if created {
		made = append(made, "signing key "+signingKey+" (0600)")
	}

	rkey := *reviewerKey
	if rkey == "" {
		if rkey, err = defaultKeyPath("--reviewer-key", "reviewer-key.pem"); err != nil {
			return fail(err)
		}
	}
	key, created, err := noa.LoadOrCreateKeyFile(rkey)
	if err != nil {
		return fail(fmt.Errorf("--reviewer-key: %w", err))
	}
	reviewersPath, err := reviewersFile(*reviewers)
	if err != nil {
		return fail(err)
	}
	signer := noa.NewKeySigner(key)
	id := *reviewerID
	if id == "" {
		// A key already trusted keeps its id; a new one takes the user's.
		if trusted, err := reviewlog.LoadReviewers(reviewersPath); err == nil {
			id, _ = trusted.IDOf(signer.PublicKey())
		}
		if id == "" {
			id = reviewUserName()
		}
	}
	if err := reviewlog.CheckReviewerID(id); err != nil {
		return usageErrorf("--reviewer-id: %v", err)
	}
	if created {
		made = append(made, "reviewer key "+rkey+" (0600) for "+id)
	}
	if added, err := reviewlog.AddReviewer(reviewersPath, id, signer.PublicKey()); err != nil {
		return fail(err)
	} else if added {
		made = append(made, fmt.Sprintf("trusted reviewers file %s, trusting %s (kid %s)", reviewersPath, id, signer.KeyID()))
	}

	configPath := *config
	if configPath == "" {
		configPath = app.PolicyFileBeside(abs)
	}
	if _, err := os.Lstat(configPath); errors.Is(err, os.ErrNotExist) {
		if _, err := guard.ParseConfig([]byte(exampleConfig), ""); err != nil {
			return fail(fmt.Errorf("the example policy does not load: %w", err))
		}
		if err := os.WriteFile(configPath, []byte(exampleConfig), 0o644); err != nil {
			return fail(err)
		}
		made = append(made, "guard policy "+configPath+" (every key at its default)")
	} else if err != nil {
		return fail(err)
	}

	if len(made) == 0 {
		fmt.Fprintf(stdout, "%s is already a Trace root; nothing was made.\n", abs)
	} else {
		fmt.Fprintln(stdout, "made:")
		for _, m := range made {
			fmt.Fprintf(stdout, "  %s\n", m)
		}
	}
	serve := []string{"--dir", abs, "--guard-config", configPath}
	if *keyFile != "" {
		serve = append(serve, "--key-file", signingKey)
	}
	if *reviewers != "" {
		serve = append(serve, "--reviewers", reviewersPath)
	}
	review := []string{"review", "list", "--dir", abs}
	if *reviewers != "" {
		review = append(review, "--reviewers", reviewersPath)
	}
	fmt.Fprintln(stdout, "next:")
	fmt.Fprintf(stdout, "  haia-trace-mcp %s     # serve MCP over stdio (what an agent host runs)\n", shellJoin(serve))
	fmt.Fprintf(stdout, "  haia-trace-mcp %s     # the reviews waiting for %s\n", shellJoin(review), id)
	return nil
}
