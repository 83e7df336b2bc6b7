package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/haia-trace-mcp/haia-trace-mcp/server"
)

// httpFlags are the serve flags for Streamable HTTP.
type httpFlags struct {
	addr string
}

func (h *httpFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.addr, "http", "", "serve Streamable HTTP on HOST:PORT instead of stdio")
}

func runHTTP(ctx context.Context, srv *server.Server, h *httpFlags, logger *slog.Logger, stderr io.Writer) int {
	fmt.Fprintln(stderr, "haia-trace-mcp: --http is not available in this build yet")
	return exitFail
}
