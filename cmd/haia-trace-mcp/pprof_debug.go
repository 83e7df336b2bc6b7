//go:build pprof

package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
)

// A build with -tags pprof serves net/http/pprof on the loopback address
// HAIA_PPROF names (e.g. 127.0.0.1:6060), for profiling a server under
// load (docs/performance.md). Release builds have none of it.
func init() {
	addr := os.Getenv("HAIA_PPROF")
	if addr == "" {
		return
	}
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		fmt.Fprintf(os.Stderr, "haia-trace-mcp: HAIA_PPROF %q: want a loopback HOST:PORT such as 127.0.0.1:6060\n", addr)
		return
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return // another process of the same build holds it (a CLI command beside the server)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	go func() { _ = http.Serve(ln, mux) }() //nolint:gosec // loopback, debug builds only
}
