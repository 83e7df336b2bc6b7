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

// run runs the command args name (see commandTable). With no command (or
// only flags) it serves MCP, which is what an agent host launches.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		args = append([]string{"version"}, args[1:]...)
	}
	return dispatch(ctx, commandTable(), args, stdin, stdout, stderr)
}
