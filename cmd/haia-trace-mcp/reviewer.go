package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const reviewerDetails = `init creates an Ed25519 key for a reviewer (mode 0600; an existing key file
is reused) and adds {ID: base64 SPKI} to the trusted reviewers file. The
server and the review commands trust a human decision only when its receipt
is signed by a key listed there. Both files live outside the Trace root.
passkey add and remove enrol or withdraw a reviewer's passkeys for the
console (see reviewer passkey --help).

exit codes: 0 done, 1 error, 2 usage
`

// defineReviewerInit is `reviewer init`: a reviewer's key, trusted.
func defineReviewerInit(fs *flag.FlagSet) runFunc {
	id := fs.String("id", "", "the reviewer's id, written into every decision receipt (required)")
	keyFile := fs.String("key-file", "", "the reviewer's key `FILE` (default: reviewer-key.pem in the user configuration directory)")
	reviewers := reviewersFlag(fs)
	tenants := tenantGrantFlag(fs)
	return func(_ context.Context, env *cmdEnv, _ []string) error {
		return runReviewerInit(env.stdout, env.stderr, id, keyFile, reviewers, *tenants)
	}
}

// tenantGrantFlag is --tenant, repeatable: the tenants a reviewer may
// decide for on a --tenants-dir server.
func tenantGrantFlag(fs *flag.FlagSet) *listFlag {
	var l listFlag
	fs.Var(&l, "tenant", "grant the reviewer a tenant `NAME` of a --tenants-dir server, or '*' for every tenant (repeatable; kept with those already granted). Without one, the reviewer decides for no tenant there")
	return &l
}

// checkTenantGrants refuses a --tenant that names no tenant.
func checkTenantGrants(tenants []string) error {
	for _, t := range tenants {
		if err := reviewlog.CheckTenantGrant(t); err != nil {
			return usageErrorf("--tenant: %v", err)
		}
	}
	return nil
}

func runReviewerInit(stdout, stderr io.Writer, id, keyFile, reviewers *string, tenants []string) error {
	if err := reviewlog.CheckReviewerID(*id); err != nil {
		return usageErrorf("--id: %v", err)
	}
	if err := checkTenantGrants(tenants); err != nil {
		return err
	}
	keyPath := *keyFile
	var err error
	if keyPath == "" {
		if keyPath, err = defaultKeyPath("--key-file", "reviewer-key.pem"); err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp reviewer init: %v; pass --key-file\n", err)
			return exitCode(exitFail)
		}
	} else if err := os.MkdirAll(filepath.Dir(keyPath), 0o700); err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer init: %v\n", err)
		return exitCode(exitFail)
	}
	reviewersPath, err := reviewersFile(*reviewers)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer init: %v\n", err)
		return exitCode(exitFail)
	}
	key, created, err := noa.LoadOrCreateKeyFile(keyPath)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer init: --key-file: %v\n", err)
		return exitCode(exitFail)
	}
	signer := noa.NewKeySigner(key)
	added, err := reviewlog.AddReviewer(reviewersPath, *id, signer.PublicKey(), tenants...)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer init: %v\n", err)
		return exitCode(exitFail)
	}
	what := "reused the key"
	if created {
		what = "created a new key"
	}
	fmt.Fprintf(stdout, "reviewer %s: %s (kid %s)\n", termsafe.String(*id), what, signer.KeyID())
	fmt.Fprintf(stdout, "key file:        %s\n", keyPath)
	if added {
		fmt.Fprintf(stdout, "trusted in:      %s (added)\n", reviewersPath)
	} else {
		fmt.Fprintf(stdout, "trusted in:      %s (already listed)\n", reviewersPath)
	}
	if len(tenants) > 0 {
		fmt.Fprintf(stdout, "tenants granted: %s\n", strings.Join(tenants, ", "))
	}
	fmt.Fprintf(stdout, "give the server: --reviewers %s\n", reviewersPath)
	return nil
}
