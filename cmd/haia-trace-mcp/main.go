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
			if len(rest) > 0 && rest[0] == "passkey" {
				return runReviewerPasskey(ctx, rest[1:], stdin, stdout, stderr)
			}
			return runReviewer(ctx, rest, stdout, stderr)
		case "status":
			return runStatus(ctx, rest, stdout, stderr)
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
			if near := suggestCommand(args[0]); near != "" {
				return serveCommand(stdout, stderr).failf("unknown command %q; did you mean %q?", args[0], near)
			}
			return serveCommand(stdout, stderr).failf("unknown command %q", args[0])
		}
	}
	return runServe(ctx, args, stdin, stdout, stderr)
}
