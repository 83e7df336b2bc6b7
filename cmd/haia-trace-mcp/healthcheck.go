package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

const healthcheckUsage = `usage:
  haia-trace-mcp healthcheck [--url http://127.0.0.1:3000/healthz] [--timeout 3s]

Probes a running server's /healthz, for a container HEALTHCHECK.
exit codes: 0 healthy, 1 not, 2 usage
`

// runHealthcheck probes a running server's /healthz, for a container
// HEALTHCHECK: exit 0 when it answers 200 within the timeout, 1 otherwise.
func runHealthcheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("healthcheck", healthcheckUsage, stdout, stderr)
	target := c.fs.String("url", "http://127.0.0.1:3000/healthz", "the URL to probe")
	timeout := c.fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	pos, code, ok := c.parse(args)
	if !ok {
		return code
	}
	if code, ok := c.wantArgs(pos, 0, 0, "no arguments"); !ok {
		return code
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *target, nil)
	if err != nil {
		fmt.Fprintf(stderr, "healthcheck: --url %q: %v\n", *target, err)
		return exitUsage
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "healthcheck: %v\n", err)
		return exitFail
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "healthcheck: %s answered %s\n", *target, resp.Status)
		return exitFail
	}
	fmt.Fprintln(stdout, "ok")
	// A server that signs x402 payments names its payer address.
	for _, line := range strings.Split(string(body), "\n") {
		if addr, ok := strings.CutPrefix(line, "payer "); ok && len(addr) == 42 && strings.HasPrefix(addr, "0x") && isHexString(addr[2:]) {
			fmt.Fprintln(stdout, "payer "+addr)
		}
	}
	return exitOK
}

func isHexString(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}
