package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestSplitList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"http://a/mcp", []string{"http://a/mcp"}},
		{"http://a/mcp, http://b/mcp,,", []string{"http://a/mcp", "http://b/mcp"}},
	} {
		if got := splitList(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("splitList(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestArgumentsOf(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.ndjson", "{\"counterparty\":\"0x1\",\"amount\":\"1\"}\n\n{\"counterparty\":\"0x2\",\"amount\":\"2\"}\n")
	notObject := write("array.ndjson", "[1]\n")
	broken := write("broken.ndjson", "{\"a\":1}\n{\"a\":\n")
	empty := write("empty.ndjson", "\n\n")
	for _, tc := range []struct {
		name    string
		c       config
		want    []string
		wantErr string
	}{
		{"file", config{argsFile: good}, []string{`{"counterparty":"0x1","amount":"1"}`, `{"counterparty":"0x2","amount":"2"}`}, ""},
		{"inline", config{args: `{"limit":1}`}, []string{`{"limit":1}`}, ""},
		{"default check_before_pay", config{tool: "check_before_pay"}, []string{`{"counterparty":"0xA11CE00000000000000000000000000000000001","amount":"0.01"}`}, ""},
		{"default other", config{tool: "list_operations"}, []string{`{}`}, ""},
		{"inline not JSON", config{args: `{`}, nil, "is not JSON"},
		{"file line not an object", config{argsFile: notObject}, nil, "line 1: not a JSON object"},
		{"file line broken", config{argsFile: broken}, nil, "line 2: not a JSON object"},
		{"file empty", config{argsFile: empty}, nil, "holds no arguments"},
		{"file missing", config{argsFile: filepath.Join(dir, "absent")}, nil, "--args-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := argumentsOf(tc.c)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDecisionOf(t *testing.T) {
	for _, tc := range []struct {
		body, want string
	}{
		{`{"result":{"content":[],"structuredContent":{"decision":"allow","reasons":[]}}}`, "allow"},
		{`{"result":{"structuredContent":{"decision":"review"}}}`, "review"},
		{`{"result":{"structuredContent":{"operations":[]}}}`, ""},
		{`{"result":{"structuredContent":{"decision":"unterminated`, ""},
	} {
		if got := decisionOf([]byte(tc.body)); got != tc.want {
			t.Errorf("decisionOf(%s) = %q, want %q", tc.body, got, tc.want)
		}
	}
}

func TestArgsOf(t *testing.T) {
	args := []string{"c0", "o0", "c1", "o1", "c2", "o2"}
	tests := []struct {
		name      string
		perClient int
		client    int
		want      []string // calls 1, 2, 3, 4
	}{
		{"every line from its own", 0, 1, []string{"o0", "c1", "o1", "c2"}},
		{"its own pair", 2, 1, []string{"c1", "o1", "c1", "o1"}},
		{"pairs wrap around", 2, 4, []string{"c1", "o1", "c1", "o1"}},
		{"one line each", 1, 5, []string{"o2", "o2", "o2", "o2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := plan{args: args, perClient: tc.perClient}
			for n, want := range tc.want {
				if got := p.argsOf(tc.client, n+1); got != want {
					t.Errorf("client %d call %d: %s, want %s", tc.client, n+1, got, want)
				}
			}
		})
	}
}

// load reports, per client and line of arguments, the decisions each was
// given: against a server that allows "c" lines and reviews "o" lines
// after the third call of a client, every client's counts add up to the
// totals and name only the lines it sent.
func TestLoadQuestions(t *testing.T) {
	var mu sync.Mutex
	calls := map[string]int{} // by session
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		session := r.Header.Get("Mcp-Session-Id")
		switch {
		case strings.Contains(string(body), `"initialize"`):
			mu.Lock()
			session = fmt.Sprintf("s%d", len(calls))
			calls[session] = 0
			mu.Unlock()
			w.Header().Set("Mcp-Session-Id", session)
			fmt.Fprint(w, `{"jsonrpc":"2.0","id":0,"result":{}}`)
		case strings.Contains(string(body), `"notifications/initialized"`):
			w.WriteHeader(http.StatusAccepted)
		default:
			mu.Lock()
			calls[session]++
			n := calls[session]
			mu.Unlock()
			d := "allow"
			if strings.Contains(string(body), `"q":"o`) && n > 3 {
				d = "review"
			}
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"decision":%q}}}`, d)
		}
	}))
	defer srv.Close()
	p := plan{urls: []string{srv.URL}, args: []string{`{"q":"c0"}`, `{"q":"o0"}`, `{"q":"c1"}`, `{"q":"o1"}`}, perClient: 2}
	rep, err := load(context.Background(), config{clients: 3, duration: 300 * time.Millisecond, tool: "check_before_pay"}, p)
	if err != nil {
		t.Fatal(err)
	}
	sum := map[string]int{}
	for _, q := range rep.Questions {
		own := p.args[(q.Client*2)%4 : (q.Client*2)%4+2]
		if !slices.Contains(own, q.Args) {
			t.Errorf("client %d reported %s, which it never sends (%v)", q.Client, q.Args, own)
		}
		for d, n := range q.Decisions {
			sum[d] += n
		}
		if strings.Contains(q.Args, `"c`) && q.Decisions["review"] != 0 {
			t.Errorf("client %d line %s: %v", q.Client, q.Args, q.Decisions)
		}
	}
	if len(rep.Questions) != 6 || !maps.Equal(sum, rep.Decisions) || rep.Decisions["review"] == 0 {
		t.Fatalf("questions %+v add up to %v; the totals are %v", rep.Questions, sum, rep.Decisions)
	}
}

// mint-hs256 adds each --claim to the token; a claim another flag sets,
// or one without a value, is refused.
func TestMintClaims(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	if code := mint([]string{"--secret-file", secret, "--sub", "a", "--claim", "org=acme", "--claim", "team=x=y"}, &out, &errOut); code != 0 {
		t.Fatalf("mint: %d %s", code, errOut.String())
	}
	parts := strings.Split(strings.TrimSpace(out.String()), ".")
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.Unmarshal(payload, &claims); err != nil || claims["org"] != "acme" || claims["team"] != "x=y" || claims["sub"] != "a" {
		t.Fatalf("claims %s (%v)", payload, err)
	}
	for _, bad := range [][]string{{"--claim", "sub=b"}, {"--claim", "org"}, {"--claim", "=x"}} {
		errOut.Reset()
		if code := mint(append([]string{"--secret-file", secret}, bad...), io.Discard, &errOut); code != 2 {
			t.Errorf("mint %v: exit %d %s, want 2", bad, code, errOut.String())
		}
	}
}
