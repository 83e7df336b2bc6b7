package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

const healthcheckDetails = `Probes a running server's /healthz, for a container HEALTHCHECK.
exit codes: 0 healthy, 1 not, 2 usage
`

// defineHealthcheck probes a running server's /healthz, for a container
// HEALTHCHECK: exit 0 when it answers 200 within the timeout, 1 otherwise.
func defineHealthcheck(fs *flag.FlagSet) runFunc {
	target := fs.String("url", "http://127.0.0.1:3000/healthz", "the `URL` to probe")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		return runHealthcheck(ctx, env.stdout, *target, *timeout)
	}
}

func runHealthcheck(ctx context.Context, stdout io.Writer, target string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return usageErrorf("--url %q: %v", target, err)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", target, resp.Status)
	}
	fmt.Fprintln(stdout, "ok")
	// A server that signs x402 payments names its payer address.
	for _, line := range strings.Split(string(body), "\n") {
		if addr, ok := strings.CutPrefix(line, "payer "); ok && len(addr) == 42 && strings.HasPrefix(addr, "0x") && isHexString(addr[2:]) {
			fmt.Fprintln(stdout, "payer "+addr)
		}
	}
	return nil
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
