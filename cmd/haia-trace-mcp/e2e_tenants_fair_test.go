package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// startTenantsServer serves tenantRoots over HTTP with HS256 tokens of
// secret naming the tenant in "org", with the extra flags.
func startTenantsServer(t *testing.T, secret []byte, extra ...string) *httpProc {
	t.Helper()
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	return startHTTPBinary(t, append([]string{"--tenants-dir", tenantRoots(t), "--tenant-claim", "org",
		"--key-file", filepath.Join(dir, "signing.pem"), "--auth-issuer", "http://127.0.0.1/local-as", "--auth-hmac-secret", secretFile}, extra...)...)
}

// admission is what the request log line says of a request's decision
// slot.
type admission struct {
	Tenant    string `json:"tenant"`
	Admission *struct {
		Seq         uint64 `json:"seq"`
		Queued      bool   `json:"queued"`
		Ahead       int    `json:"ahead"`
		OthersFirst int    `json:"others_first"`
	} `json:"admission"`
}

// admissions reads the admissions of the server's request log, by tenant.
func admissions(t *testing.T, log string) map[string][]admission {
	t.Helper()
	by := map[string][]admission{}
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var a admission
		if json.Unmarshal(sc.Bytes(), &a) == nil && a.Admission != nil {
			by[a.Tenant] = append(by[a.Tenant], a)
		}
	}
	return by
}

// metric reads one sample of the server's /metrics, e.g.
// `haia_fair_refused_total{bound="queue"}`.
func metric(t *testing.T, base, sample string) float64 {
	t.Helper()
	_, body := httpGet(t, base+"/metrics")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s:\n%s", sample, body)
	return 0
}

// While tenant acme floods one server (12 callers at once, one decision
// slot, at most 4 of acme's requests waiting), tenant globex's two callers
// are all answered, and each of globex's requests was admitted in fair
// turn: while it waited, at most one request of acme's went first for
// each request of globex's ahead of it and itself. acme's requests past
// its queue are refused with 429 naming its limit; globex's never are.
func TestTenantFloodDoesNotTakeAnotherTenantsTurn(t *testing.T) {
	secret := []byte(strings.Repeat("t", 48))
	p := startTenantsServer(t, secret, "--rate-limit", "100000", "--tenant-slots", "1", "--tenant-queue", "4", "--tenant-wait", "30s")
	if got := metric(t, p.base, "haia_fair_slots"); got != 1 {
		t.Fatalf("haia_fair_slots %v, want 1", got)
	}
	token := func(tenant string, i int) string {
		return signHS256(t, secret, map[string]any{"iss": "http://127.0.0.1/local-as", "aud": p.resource, "sub": fmt.Sprintf("agent-%d", i), "org": tenant,
			"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
	}

	// acme's flood: raw tools/call requests, each caller on a session of
	// its own, as fast as they are answered or refused.
	stop := make(chan struct{})
	var flood sync.WaitGroup
	var served, refused, odd atomic.Int64
	var oddMu sync.Mutex
	var oddSeen string
	toks, sids := make([]string, 12), make([]string, 12)
	for i := range 12 { // every session first: initialize is admitted like any request
		toks[i] = token("acme", i)
		sids[i] = rawSession(t, p.resource, toks[i])
	}
	for i := range 12 {
		tok, sid := toks[i], sids[i]
		flood.Add(1)
		go func() {
			defer flood.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"check_before_pay","arguments":{"counterparty":%q,"amount":"0.10"}}}`, n+2, sellerA)
				req, _ := http.NewRequest(http.MethodPost, p.resource, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				req.Header.Set("Authorization", "Bearer "+tok)
				req.Header.Set("Mcp-Session-Id", sid)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					odd.Add(1)
					continue
				}
				out, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case resp.StatusCode == http.StatusOK:
					served.Add(1)
				case resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "1" &&
					strings.Contains(string(out), `tenant \"acme\" is at its limit: 4 requests already wait for the 1 decision slots`):
					refused.Add(1)
				default:
					odd.Add(1)
					oddMu.Lock()
					oddSeen = fmt.Sprintf("%d %s", resp.StatusCode, out)
					oddMu.Unlock()
				}
			}
		}()
	}
	// globex: two real MCP clients asking in turn, each 15 times.
	var calm sync.WaitGroup
	var globexErrs []string
	var mu sync.Mutex
	for i := range 2 {
		tok := token("globex", i)
		cs, err := httpSession(t, p.resource, func() string { return tok })
		if err != nil {
			t.Fatalf("globex caller %d: %v\n%s", i, err, p.logs())
		}
		calm.Add(1)
		go func() {
			defer calm.Done()
			for range 15 {
				res := callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.10"})
				if res.IsError {
					mu.Lock()
					globexErrs = append(globexErrs, resultText(res))
					mu.Unlock()
				}
			}
		}()
	}
	calm.Wait()
	close(stop)
	flood.Wait()
	if len(globexErrs) > 0 {
		t.Fatalf("globex's questions failed while acme flooded: %q", globexErrs)
	}
	if odd.Load() > 0 {
		t.Fatalf("%d of acme's requests were neither answered nor refused with its limit; last %s", odd.Load(), oddSeen)
	}
	if served.Load() == 0 || refused.Load() == 0 {
		t.Fatalf("acme's flood: %d answered, %d refused; want both (the queue bound is 4 of 12 callers)", served.Load(), refused.Load())
	}
	if got := metric(t, p.base, `haia_fair_refused_total{bound="queue"}`); got != float64(refused.Load()) {
		t.Errorf("haia_fair_refused_total{bound=\"queue\"} %v, acme was refused %d times", got, refused.Load())
	}

	by := admissions(t, p.logs())
	queued := 0
	for _, a := range by["globex"] {
		ad := a.Admission
		if ad.Queued {
			queued++
		}
		// Two tenants in turn: a waiting globex request lets at most
		// one of acme's go first per globex request served before it.
		if ad.OthersFirst > ad.Ahead+1 {
			t.Errorf("globex's request #%d: %d of acme's went first, with %d of its own ahead (fair turn allows %d)", ad.Seq, ad.OthersFirst, ad.Ahead, ad.Ahead+1)
		}
	}
	// initialize, notifications/initialized, 15 calls: for each of the two callers.
	if n := len(by["globex"]); n < 30 {
		t.Fatalf("%d admissions of globex logged, want at least its 30 calls", n)
	}
	// The flood held the slot: most of globex's requests had to wait.
	if queued < len(by["globex"])/2 {
		t.Fatalf("only %d of globex's %d requests waited for the slot: acme's flood did not contend", queued, len(by["globex"]))
	}
	if len(by["acme"]) < int(served.Load()) {
		t.Fatalf("%d admissions of acme logged, %d answered", len(by["acme"]), served.Load())
	}
	t.Logf("acme: %d answered, %d refused; globex: %d admissions, %d after a wait", served.Load(), refused.Load(), len(by["globex"]), queued)
}
