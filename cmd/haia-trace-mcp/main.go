// Command haia-trace-mcp serves Haia Trace operation receipts and a
// pre-payment guard to AI agents over MCP, and carries the operator's
// command-line tools (review, build, verify, ...).
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes shared by the subcommands that do not define their own.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// run dispatches to a subcommand. With no subcommand (or only flags) it
// serves MCP, which is what an agent host launches.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		return runVersion(args[1:], stdout, stderr)
	}
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		rest := args[1:]
		switch args[0] {
		case "build":
			return runBuild(ctx, rest, stdout, stderr)
		case "policy":
			return runPolicy(ctx, rest, stdout, stderr)
		case "verify":
			return runVerify(ctx, rest, stdout, stderr)
		case "signer":
			return runSigner(ctx, rest, stdout, stderr)
		case "review":
			return runReview(ctx, rest, stdout, stderr)
		case "payer":
			return runPayer(ctx, rest, stdout, stderr)
		case "authorization":
			return runAuthorization(ctx, rest, stdout, stderr)
		case "init":
			return runInit(ctx, rest, stdout, stderr)
		case "reviewer":
			return runReviewer(ctx, rest, stdout, stderr)
		case "audit":
			return runAudit(ctx, rest, stdout, stderr)
		case "chain":
			return runChain(ctx, rest, stdout, stderr)
		case "store":
			return runStore(ctx, rest, stdout, stderr)
		case "healthcheck":
			return runHealthcheck(ctx, rest, stdout, stderr)
		case "demo":
			return runDemo(ctx, rest, stdout, stderr)
		case "proxy":
			return runProxy(ctx, rest, stdin, stdout, stderr)
		case "version":
			return runVersion(rest, stdout, stderr)
		case "help":
			return runServe(ctx, []string{"--help"}, stdin, stdout, stderr)
		case "completion":
			return runCompletion(rest, stdout, stderr)
		default:
			return serveCommand(stdout, stderr).failf("unknown command %q", args[0])
		}
	}
	return runServe(ctx, args, stdin, stdout, stderr)
}

const usage = `usage:
  haia-trace-mcp [--dir .trace] [flags]        serve MCP (stdio by default, --http for Streamable HTTP)
  haia-trace-mcp build RUN_FILE [--template NAME|PATH] [--templates-dir DIR]
  haia-trace-mcp policy check FILE | policy eval FILE --input INPUT.json
  haia-trace-mcp verify CHAIN [--keyring K] [--checkpoint C] [--identity M]
  haia-trace-mcp signer --key-file K --listen unix:PATH | --payer-key K --listen unix:PATH
  haia-trace-mcp payer address --payer-key K | --payer-signer unix:PATH
  haia-trace-mcp authorization show NONCE|RECEIPT_ID [--dir .trace] [--json]
  haia-trace-mcp review list|show|approve|reject|watch [<review_id>] [--dir .trace] [--all] [--note "…"] [--reviewer-key K] [--json]
  haia-trace-mcp init [DIR]                       a Trace root from nothing: layout, keys, a reviewer, an example policy
  haia-trace-mcp reviewer init --id ID [--key-file K] [--reviewers F]
  haia-trace-mcp audit [--dir .trace] [--reviewers F] [--keyring K]
  haia-trace-mcp store migrate|import|export --store postgres://… [--dir .trace]
  haia-trace-mcp chain list|export ID|checkpoint ID [--dir .trace]
  haia-trace-mcp healthcheck [--url http://127.0.0.1:3000/healthz] [--timeout 3s]
  haia-trace-mcp proxy --guard-map FILE [--dir .trace] [flags] -- UPSTREAM_COMMAND [ARGS…] | --upstream-url URL
  haia-trace-mcp demo [--keep DIR]                 the whole story on a simulated Trace root
  haia-trace-mcp version | --version
`
