// Command loadtest drives a running haia-trace-mcp over Streamable HTTP with
// a fixed number of concurrent clients for a fixed time and reports
// throughput, latency percentiles and errors by status. It starts nothing
// itself and stops by itself.
//
//	loadtest --url http://127.0.0.1:3000/mcp [--token-file F] [--duration 30s] [--clients 32] [--tool list_operations]
//	         [--args JSON | --args-file F]
//
// --url and --token-file take comma-separated lists: client i talks to the
// i-th URL modulo their number (so the clients spread evenly over several
// replicas) with the i-th token modulo theirs (so each client can be its own
// caller). --args-file holds one JSON arguments object a line; each client
// walks the lines from its own starting point, so the questions mix.
package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type config struct {
	url       string
	tokenFile string
	duration  time.Duration
	clients   int
	tool      string
	args      string
	argsFile  string
	perClient int
	jsonOut   bool
	row       bool
}

func run(ctx context.Context, argv []string, stdout, stderr io.Writer) int {
	if len(argv) > 0 && argv[0] == "mint-hs256" {
		return mint(argv[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	fs.StringVar(&c.url, "url", "http://127.0.0.1:3000/mcp", "the MCP endpoint; a comma-separated list spreads the clients round-robin over them")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding a bearer token (none: no Authorization header); a comma-separated list gives client i the i-th modulo their number")
	fs.DurationVar(&c.duration, "duration", 30*time.Second, "how long to run")
	fs.IntVar(&c.clients, "clients", 32, "concurrent clients, each with its own MCP session")
	fs.StringVar(&c.tool, "tool", "list_operations", "the tool to call")
	fs.StringVar(&c.args, "args", "", "tool arguments as JSON (default: a fitting example for list_operations and check_before_pay)")
	fs.StringVar(&c.argsFile, "args-file", "", "file of tool arguments, one JSON object a line, taken in turn (instead of --args)")
	fs.IntVar(&c.perClient, "args-per-client", 0, "give client i only the lines i*N to i*N+N-1 (modulo their number) of --args-file, walked in turn (0: every client walks every line)")
	fs.BoolVar(&c.jsonOut, "json", false, "print the report as one JSON object")
	fs.BoolVar(&c.row, "row", false, "print one table row: req/s p50 p99 errors")
	if err := fs.Parse(argv); err != nil {
		return 2
	}
	if c.clients < 1 || c.clients > 4096 || c.duration <= 0 || c.duration > time.Hour {
		fmt.Fprintln(stderr, "loadtest: --clients must be 1..4096 and --duration 0..1h")
		return 2
	}
	if c.perClient < 0 || c.perClient > 0 && c.argsFile == "" {
		fmt.Fprintln(stderr, "loadtest: --args-per-client must be positive and needs --args-file")
		return 2
	}
	if c.args != "" && c.argsFile != "" {
		fmt.Fprintln(stderr, "loadtest: give --args or --args-file, not both")
		return 2
	}
	argsList, err := argumentsOf(c)
	if err != nil {
		fmt.Fprintf(stderr, "loadtest: %v\n", err)
		return 2
	}
	urls := splitList(c.url)
	if len(urls) == 0 {
		fmt.Fprintln(stderr, "loadtest: --url is empty")
		return 2
	}
	var tokens []string
	for _, f := range splitList(c.tokenFile) {
		b, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(stderr, "loadtest: --token-file: %v\n", err)
			return 2
		}
		tokens = append(tokens, strings.TrimSpace(string(b)))
	}
	rep, err := load(ctx, c, plan{urls: urls, tokens: tokens, args: argsList, perClient: c.perClient})
	if err != nil {
		fmt.Fprintf(stderr, "loadtest: %v\n", err)
		return 1
	}
	switch {
	case c.jsonOut:
		_ = json.NewEncoder(stdout).Encode(rep)
	case c.row:
		errs := make([]string, 0, len(rep.Errors))
		for k, v := range rep.Errors {
			errs = append(errs, fmt.Sprintf("%s=%d", k, v))
		}
		slices.Sort(errs)
		if len(errs) == 0 {
			errs = []string{"none"}
		}
		fmt.Fprintf(stdout, "%.0f %s %s %s\n", rep.RPS, rep.P50.Round(10*time.Microsecond), rep.P99.Round(10*time.Microsecond), strings.Join(errs, ","))
	default:
		fmt.Fprintf(stdout, "tool=%s clients=%d urls=%d duration=%s requests=%d rps=%.0f p50=%s p99=%s errors=%v decisions=%v\n",
			rep.Tool, rep.Clients, rep.URLs, rep.Duration, rep.Requests, rep.RPS, rep.P50, rep.P99, rep.Errors, rep.Decisions)
	}
	if rep.Errors5xx > 0 {
		return 1
	}
	return 0
}

// report is what one run measured.
type report struct {
	Tool      string         `json:"tool"`
	Clients   int            `json:"clients"`
	URLs      int            `json:"urls"`
	Duration  string         `json:"duration"`
	Requests  int            `json:"requests"`
	RPS       float64        `json:"rps"`
	P50       time.Duration  `json:"p50_ns"`
	P99       time.Duration  `json:"p99_ns"`
	Errors    map[string]int `json:"errors"`
	Errors5xx int            `json:"errors_5xx"`
	// Decisions counts the successful answers by their structured
	// "decision" (allow, review, block), when the tool gives one.
	Decisions map[string]int `json:"decisions"`
	// Questions are the same counts per client and arguments line it
	// sent, in client then line order: who was answered what.
	Questions []question `json:"questions"`
}

// question is what one client was answered to one line of arguments.
type question struct {
	Client    int            `json:"client"`
	Args      string         `json:"args"`
	Decisions map[string]int `json:"decisions"`
	// Cut counts the calls the end of the run cut short: the server may
	// have answered (and recorded) them, the client did not read it.
	Cut int `json:"cut"`
}

// plan is who each client is: client i posts to urls[i%len(urls)] with
// tokens[i%len(tokens)] (none when empty) and walks args from line i, or,
// with perClient N, walks only lines i*N to i*N+N-1 (modulo len(args)).
type plan struct {
	urls      []string
	tokens    []string
	args      []string
	perClient int
}

// argsOf is the arguments client i sends in its call n (from 1).
func (p plan) argsOf(i, n int) string { return p.args[p.lineOf(i, n)] }

// lineOf is the index in args of what client i sends in its call n.
func (p plan) lineOf(i, n int) int {
	if p.perClient > 0 {
		return (i*p.perClient + (n-1)%p.perClient) % len(p.args)
	}
	return (i + n - 1) % len(p.args)
}

// splitList is the non-empty, trimmed items of a comma-separated list.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// argumentsOf is the tool arguments the clients send: --args, the lines of
// --args-file, or a fitting default for the tool.
func argumentsOf(c config) ([]string, error) {
	var list []string
	switch {
	case c.argsFile != "":
		b, err := os.ReadFile(c.argsFile)
		if err != nil {
			return nil, fmt.Errorf("--args-file: %w", err)
		}
		for n, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" {
				continue
			}
			if !json.Valid([]byte(line)) || !strings.HasPrefix(line, "{") {
				return nil, fmt.Errorf("--args-file %s line %d: not a JSON object: %q", c.argsFile, n+1, line)
			}
			list = append(list, line)
		}
		if len(list) == 0 {
			return nil, fmt.Errorf("--args-file %s holds no arguments (one JSON object a line)", c.argsFile)
		}
	case c.args != "":
		if !json.Valid([]byte(c.args)) {
			return nil, fmt.Errorf("--args %q is not JSON", c.args)
		}
		list = []string{c.args}
	case c.tool == "check_before_pay":
		list = []string{`{"counterparty":"0xA11CE00000000000000000000000000000000001","amount":"0.01"}`}
	default:
		list = []string{`{}`}
	}
	return list, nil
}

// decisionMark precedes the decision in a check_before_pay answer.
var decisionMark = []byte(`"structuredContent":{"decision":"`)

// decisionOf is the structured decision of a tool answer, "" when none.
func decisionOf(body []byte) string {
	i := bytes.Index(body, decisionMark)
	if i < 0 {
		return ""
	}
	rest := body[i+len(decisionMark):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 || j > 16 {
		return ""
	}
	return string(rest[:j])
}

type client struct {
	http    *http.Client
	url     string
	token   string
	session string
}

func (c *client) post(ctx context.Context, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.session != "" {
		req.Header.Set("Mcp-Session-Id", c.session)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if c.session == "" {
		c.session = resp.Header.Get("Mcp-Session-Id")
	}
	return resp.StatusCode, b, err
}

func (c *client) open(ctx context.Context) error {
	st, b, err := c.post(ctx, []byte(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"loadtest","version":"1"}}}`))
	if err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	if st != http.StatusOK {
		return fmt.Errorf("initialize: HTTP %d: %s", st, bytes.TrimSpace(b))
	}
	if st, b, err = c.post(ctx, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil || st/100 != 2 {
		return fmt.Errorf("initialized: HTTP %d %v: %s", st, err, bytes.TrimSpace(b))
	}
	return nil
}

func load(ctx context.Context, c config, p plan) (report, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: c.clients, MaxConnsPerHost: c.clients, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	clients := make([]*client, c.clients)
	for i := range clients {
		clients[i] = &client{http: hc, url: p.urls[i%len(p.urls)]}
		if len(p.tokens) > 0 {
			clients[i].token = p.tokens[i%len(p.tokens)]
		}
		if err := clients[i].open(ctx); err != nil {
			return report{}, fmt.Errorf("client %d at %s: %w", i, clients[i].url, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, c.duration)
	defer cancel()
	type result struct {
		lat       []time.Duration
		errors    map[string]int
		decisions map[string]int
		questions map[int]*question // by line of args
	}
	results := make([]result, c.clients)
	var wg sync.WaitGroup
	start := time.Now()
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := result{errors: map[string]int{}, decisions: map[string]int{}, questions: map[int]*question{}}
			for n := 1; ctx.Err() == nil; n++ {
				line := p.lineOf(i, n)
				args := p.args[line]
				q := r.questions[line]
				if q == nil {
					q = &question{Client: i, Args: args, Decisions: map[string]int{}}
					r.questions[line] = q
				}
				body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, n, c.tool, args)
				t0 := time.Now()
				st, b, err := cl.post(ctx, []byte(body))
				switch {
				case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
					// the run ended during this call; not an error of the server
					q.Cut++
				case err != nil:
					r.errors["transport"]++
				case st != http.StatusOK:
					r.errors[fmt.Sprintf("http_%d", st)]++
				case bytes.Contains(b, []byte(`"isError":true`)) || bytes.Contains(b, []byte(`"error":{`)):
					r.errors["tool_error"]++
				default:
					r.lat = append(r.lat, time.Since(t0))
					if d := decisionOf(b); d != "" {
						r.decisions[d]++
						q.Decisions[d]++
					}
				}
			}
			results[i] = r
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	rep := report{Tool: c.tool, Clients: c.clients, URLs: len(p.urls), Duration: elapsed.Round(time.Millisecond).String(),
		Errors: map[string]int{}, Decisions: map[string]int{}}
	var all []time.Duration
	for _, r := range results {
		for _, line := range slices.Sorted(maps.Keys(r.questions)) {
			rep.Questions = append(rep.Questions, *r.questions[line])
		}
		all = append(all, r.lat...)
		for k, v := range r.decisions {
			rep.Decisions[k] += v
		}
		for k, v := range r.errors {
			rep.Errors[k] += v
			if strings.HasPrefix(k, "http_5") {
				rep.Errors5xx += v
			}
		}
	}
	slices.Sort(all)
	rep.Requests = len(all)
	rep.RPS = float64(len(all)) / elapsed.Seconds()
	if len(all) > 0 {
		rep.P50 = all[len(all)*50/100]
		rep.P99 = all[min(len(all)-1, len(all)*99/100)]
	}
	return rep, nil
}

// mint prints an HS256 access token, so that the load test can run with
// authentication on against a --auth-hmac-secret server without an
// authorization server.
func mint(argv []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadtest mint-hs256", flag.ContinueOnError)
	fs.SetOutput(stderr)
	secretFile := fs.String("secret-file", "", "the HS256 secret file the server was given")
	issuer := fs.String("issuer", "", "iss")
	audience := fs.String("audience", "", "aud: the resource URL")
	scope := fs.String("scope", "", "space-separated scopes")
	sub := fs.String("sub", "loadtest", "sub")
	var extra claimList
	fs.Var(&extra, "claim", "`NAME=VALUE`: one more string claim (a tenant claim, say); repeatable")
	ttl := fs.Duration("ttl", time.Hour, "lifetime")
	if err := fs.Parse(argv); err != nil {
		return 2
	}
	secret, err := os.ReadFile(*secretFile)
	if err != nil {
		fmt.Fprintf(stderr, "mint-hs256: --secret-file: %v\n", err)
		return 2
	}
	now := time.Now()
	c := map[string]any{"iss": *issuer, "aud": *audience, "sub": *sub, "scope": *scope, "iat": now.Unix(), "exp": now.Add(*ttl).Unix()}
	for _, kv := range extra {
		name, value, _ := strings.Cut(kv, "=")
		if _, taken := c[name]; taken {
			fmt.Fprintf(stderr, "mint-hs256: --claim %s: set by its own flag\n", name)
			return 2
		}
		c[name] = value
	}
	claims, err := json.Marshal(c)
	if err != nil {
		fmt.Fprintf(stderr, "mint-hs256: %v\n", err)
		return 1
	}
	enc := base64.RawURLEncoding.EncodeToString
	input := enc([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc(claims)
	mac := hmac.New(sha256.New, bytes.TrimRight(secret, " \t\r\n"))
	mac.Write([]byte(input))
	fmt.Fprintln(stdout, input+"."+enc(mac.Sum(nil)))
	return 0
}

// claimList is the repeatable --claim NAME=VALUE.
type claimList []string

func (l *claimList) String() string { return strings.Join(*l, ",") }

func (l *claimList) Set(v string) error {
	if name, _, ok := strings.Cut(v, "="); !ok || name == "" {
		return fmt.Errorf("want NAME=VALUE, got %q", v)
	}
	*l = append(*l, v)
	return nil
}
