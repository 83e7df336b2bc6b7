package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth/authtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// payUpstreamBin is the project's own paying MCP server
// (internal/payupstream), built once for the proxy tests.
var (
	payUpstreamOnce sync.Once
	payUpstreamBin  string
	payUpstreamErr  error
)

func payUpstream(t testing.TB) string {
	t.Helper()
	payUpstreamOnce.Do(func() {
		payUpstreamBin = filepath.Join(filepath.Dir(binPath), "payupstream")
		cmd := exec.Command("go", "build", "-o", payUpstreamBin, "../../internal/payupstream")
		cmd.Stderr = os.Stderr
		payUpstreamErr = cmd.Run()
	})
	if payUpstreamErr != nil {
		t.Fatalf("building the test upstream: %v", payUpstreamErr)
	}
	return payUpstreamBin
}

// payUpstreamTools is how many tools the test upstream lists.
const payUpstreamTools = 15

const sellerDenied = "0xDEAD000000000000000000000000000000000003"

const proxyMapJSON = `{"tools": {
  "send_usdc": {"counterparty": "to", "amount": "amount", "amountUnit": "display", "asset": "USDC"},
  "slow_send": {"counterparty": "to", "amount": "amount", "amountUnit": "display"},
  "fail_send": {"counterparty": "to", "amount": "amount", "amountUnit": "display", "errors": "unpaid"},
  "pay_then_fail": {"counterparty": "to", "amount": "amount", "amountUnit": "display"},
  "task_send": {"counterparty": "to", "amount": "amount", "amountUnit": "display", "errors": "unpaid"},
  "pay_invoice": {"counterparty": "payee.address", "amount": "total.value", "amountUnit": "atomic", "asset": "total.token"}
}, "unmapped": "forward"}`

// proxyEnv is one proxy in front of the test upstream over stdio.
type proxyEnv struct {
	root, payLog, pidFile, mapPath, config string
	stderr                                 *lockedBuffer
	cs                                     *mcp.ClientSession
	cmd                                    *exec.Cmd
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// proxyArgs are the proxy's command line in front of the test upstream.
func (e *proxyEnv) args(extra ...string) []string {
	a := []string{"proxy", "--dir", e.root, "--key-file", filepath.Join(filepath.Dir(e.payLog), "signing-key.pem"),
		"--guard-map", e.mapPath, "--agent-id", "agent-007"}
	if e.config != "" {
		a = append(a, "--guard-config", e.config)
	}
	return append(a, extra...)
}

func newProxyEnv(t *testing.T, gmap, config string) *proxyEnv {
	t.Helper()
	dir := t.TempDir()
	e := &proxyEnv{root: sampleRoot(t), payLog: filepath.Join(dir, "paid.ndjson"), pidFile: filepath.Join(dir, "pids"),
		mapPath: writeFile(t, "guard-map.json", gmap), stderr: &lockedBuffer{}}
	if config != "" {
		e.config = writeFile(t, "haia-guard.config.json", config)
	}
	return e
}

func (e *proxyEnv) command(upstreamEnv []string, extra ...string) *exec.Cmd {
	cmd := exec.Command(binPath, append(e.args(extra...), "--", payUpstreamBinPath())...)
	cmd.Env = append(append(os.Environ(), "PAY_LOG="+e.payLog, "PAY_PID_FILE="+e.pidFile), upstreamEnv...)
	cmd.Stderr = e.stderr
	return cmd
}

func payUpstreamBinPath() string { return payUpstreamBin }

// start runs the proxy and connects the official Go SDK client to it.
func (e *proxyEnv) start(t *testing.T, opts *mcp.ClientOptions, upstreamEnv ...string) {
	t.Helper()
	payUpstream(t)
	e.cmd = e.command(upstreamEnv)
	// Runs after the session is closed and the proxy has exited.
	t.Cleanup(func() {
		if strings.Contains(e.stderr.String(), "DATA RACE") {
			t.Errorf("the race detector reported in the proxy:\n%s", e.stderr)
		}
	})
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-proxy", Version: "1"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: e.cmd}, nil)
	if err != nil {
		t.Fatalf("connect to the proxy: %v (stderr: %s)", err, e.stderr)
	}
	e.cs = cs
	t.Cleanup(func() { cs.Close() })
}

// paid lists the calls the upstream carried out.
func (e *proxyEnv) paid(t testing.TB) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(e.payLog)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("pay log line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// callRaw calls a tool with arguments given as JSON text, byte for byte.
func (e *proxyEnv) callRaw(t *testing.T, name, args string) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := e.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: json.RawMessage(args)})
	if err != nil {
		t.Fatalf("call %s %s: %v (stderr: %s)", name, args, err, e.stderr)
	}
	return res
}

type proxyDecision struct {
	Decision  string `json:"decision"`
	ReviewID  string `json:"review_id"`
	ReceiptID string `json:"receipt_id"`
	Tool      string `json:"tool"`
	Reasons   []struct {
		Rule string `json:"rule"`
	} `json:"reasons"`
}

func decisionOf(t *testing.T, res *mcp.CallToolResult) proxyDecision {
	t.Helper()
	if !res.IsError {
		t.Fatalf("want a tool error carrying the decision, got %s", resultText(res))
	}
	var d proxyDecision
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &d); err != nil || d.Decision == "" {
		t.Fatalf("no decision in %s (%v)", resultText(res), err)
	}
	return d
}

// chainReceipts reads the server's decision chain as JSON objects, once
// every forwarded call it allowed has its outcome receipt: the proxy signs
// that receipt after it has answered the call (waiting at most 15 s, then
// reading the chain as it is, for the caller to judge).
func chainReceipts(t *testing.T, root string) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		rs := readChainReceipts(t, root)
		if outcomesRecorded(rs) || time.Now().After(deadline) {
			return rs
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outcomesRecorded says whether every payment a service allowed in rs
// (a forwarded call's decision) is followed by its outcome: a receipt of
// the same action, EXECUTED or FAILED.
func outcomesRecorded(rs []map[string]any) bool {
	open := map[string]bool{}
	for _, r := range rs {
		id := receiptField(r, "action", "id")
		switch receiptField(r, "governance", "verdict") {
		case "ALLOWED":
			if receiptField(r, "agent", "principal") == "SERVICE" && receiptField(r, "action", "canonical") == "x402.payment" {
				open[id] = true
			}
		case "EXECUTED", "FAILED":
			delete(open, id)
		}
	}
	return len(open) == 0
}

// readChainReceipts reads the server's decision chain as it is now.
func readChainReceipts(t *testing.T, root string) []map[string]any {
	t.Helper()
	chain, _ := chainFile(t, root)
	out, errOut, code := runCLI(t, "chain", "export", chain, "--dir", root)
	if code != 0 {
		t.Fatalf("chain export: %d %s", code, errOut)
	}
	var rs []map[string]any
	if err := json.Unmarshal([]byte(out), &rs); err != nil {
		t.Fatalf("chain export: %v", err)
	}
	return rs
}

func receiptField(r map[string]any, obj, key string) string {
	m, _ := r[obj].(map[string]any)
	s, _ := m[key].(string)
	return s
}

func TestProxyForwardsOnlyWhatTheGuardAllows(t *testing.T) {
	e := newProxyEnv(t, proxyMapJSON, `{"denylist": ["`+sellerDenied+`"]}`)
	e.start(t, nil)

	// tools/list: the upstream's tools, schemas untouched, plus the read
	// tools; no check_before_pay (the proxy asks the engine itself).
	ctx := context.Background()
	lt, err := e.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]*mcp.Tool{}
	for _, tool := range lt.Tools {
		names[tool.Name] = tool
	}
	for _, want := range []string{"send_usdc", "pay_invoice", "slow_send", "fail_send", "echo", "change_tools", "list_operations", "get_receipt", "explain", "get_review_status"} {
		if names[want] == nil {
			t.Errorf("tools/list lacks %s", want)
		}
	}
	if names["check_before_pay"] != nil {
		t.Error("the proxy serves check_before_pay")
	}
	if b, _ := json.Marshal(names["echo"].InputSchema); !strings.Contains(string(b), `"$comment":"kept byte for byte"`) {
		t.Errorf("echo's input schema was changed: %s", b)
	}

	// allow → forwarded once, the answer is the upstream's.
	res := e.callRaw(t, "send_usdc", `{"to":"`+sellerA+`","amount":"0.25"}`)
	if res.IsError || !strings.Contains(resultText(res), "paid by send_usdc") {
		t.Fatalf("allowed call: %s (stderr %s)", resultText(res), e.stderr)
	}
	if n := len(e.paid(t)); n != 1 {
		t.Fatalf("upstream ran %d calls, want 1", n)
	}

	// review → not forwarded, the decision in structured content; the same
	// call again finds the same review and still does not reach upstream.
	reviewArgs := `{"to":"` + sellerB + `","amount":"0.10","memo":"x"}`
	d := decisionOf(t, e.callRaw(t, "send_usdc", reviewArgs))
	if d.Decision != "review" || d.ReviewID == "" || d.ReceiptID == "" || d.Tool != "send_usdc" {
		t.Fatalf("review: %+v", d)
	}
	if d2 := decisionOf(t, e.callRaw(t, "send_usdc", reviewArgs)); d2.ReviewID != d.ReviewID {
		t.Fatalf("the same call opened review %s, want %s", d2.ReviewID, d.ReviewID)
	}
	if n := len(e.paid(t)); n != 1 {
		t.Fatalf("a call under review reached the upstream (%d calls)", n)
	}
	if _, errOut, code := runCLI(t, "review", "approve", d.ReviewID, "--dir", e.root); code != 0 {
		t.Fatalf("review approve: %d %s", code, errOut)
	}
	// The approval covers this call only: other arguments (another memo)
	// are another question for the human.
	if other := decisionOf(t, e.callRaw(t, "send_usdc", `{"to":"`+sellerB+`","amount":"0.10","memo":"y"}`)); other.Decision != "review" || other.ReviewID == d.ReviewID {
		t.Fatalf("an approval was spent on different arguments: %+v", other)
	}
	if n := len(e.paid(t)); n != 1 {
		t.Fatalf("different arguments rode on the approval (%d calls)", n)
	}
	if res := e.callRaw(t, "send_usdc", reviewArgs); res.IsError {
		t.Fatalf("approved call: %s", resultText(res))
	}
	paid := e.paid(t)
	if len(paid) != 2 || !strings.Contains(string(mustJSON(paid[1]["arguments"])), `"memo":"x"`) {
		t.Fatalf("approved call forwarded: %v", paid)
	}
	// Once: the identical call again follows the rules again.
	if again := decisionOf(t, e.callRaw(t, "send_usdc", reviewArgs)); again.Decision != "review" || again.ReviewID == d.ReviewID {
		t.Fatalf("an approval was used twice: %+v", again)
	}

	// block → never forwarded.
	if b := decisionOf(t, e.callRaw(t, "send_usdc", `{"to":"`+sellerDenied+`","amount":"0.01"}`)); b.Decision != "block" {
		t.Fatalf("denylisted: %+v", b)
	}
	// An atomic amount in a nested path: 250000 micro-USDC is 0.25.
	if res := e.callRaw(t, "pay_invoice", `{"payee":{"address":"`+sellerA+`"},"total":{"value":"250000","token":"USDC"}}`); res.IsError {
		t.Fatalf("pay_invoice: %s", resultText(res))
	}
	// Unmapped tools pass through.
	if res := e.callRaw(t, "echo", `{"text":"hello"}`); res.IsError || resultText(res) != "hello" {
		t.Fatalf("echo: %s", resultText(res))
	}
	if n := len(e.paid(t)); n != 3 {
		t.Fatalf("upstream ran %d calls, want 3", n)
	}

	// The chain: every forwarded call's ALLOWED receipt is followed by an
	// EXECUTED one with the same action and paramsHash; different
	// arguments give different hashes; the chain verifies.
	rs := chainReceipts(t, e.root)
	allowed := map[string]string{}
	executed := 0
	hashes := map[string]bool{}
	for _, r := range rs {
		id, ph := receiptField(r, "action", "id"), receiptField(r, "action", "paramsHash")
		switch receiptField(r, "governance", "verdict") {
		case "ALLOWED":
			if receiptField(r, "agent", "principal") == "SERVICE" {
				allowed[id] = ph
				hashes[ph] = true
			}
		case "EXECUTED":
			if allowed[id] != ph || ph == "" {
				t.Errorf("EXECUTED receipt %s does not match its decision (%q vs %q)", id, ph, allowed[id])
			}
			executed++
		}
	}
	if executed != 3 || len(hashes) != 3 {
		t.Fatalf("want 3 executed calls with 3 distinct paramsHashes, got %d and %d: %v", executed, len(hashes), hashes)
	}
	chain, _ := chainFile(t, e.root)
	if out, code := verifyChain(t, e.root, chain); code != 0 {
		t.Fatalf("verify: %d %s", code, out)
	}
}

func mustJSON(v any) []byte { b, _ := json.Marshal(v); return b }

// Every spelling that could move money off the mapped path, or that the
// map cannot read exactly, is refused without reaching the upstream.
func TestProxyArgumentSpellingsNeverForward(t *testing.T) {
	e := newProxyEnv(t, proxyMapJSON, "")
	e.start(t, nil)
	cases := []struct{ name, tool, args, want string }{
		{"duplicate key", "send_usdc", `{"to":"` + sellerA + `","to":"` + sellerB + `","amount":"0.25"}`, "duplicate"},
		{"duplicate amount", "send_usdc", `{"to":"` + sellerA + `","amount":"0.25","amount":"250"}`, "duplicate"},
		{"amount as float", "send_usdc", `{"to":"` + sellerA + `","amount":0.25}`, "exactly"},
		{"amount as integer number", "send_usdc", `{"to":"` + sellerA + `","amount":1}`, "decimal string"},
		{"amount with exponent", "send_usdc", `{"to":"` + sellerA + `","amount":"2.5e-1"}`, "not a plain decimal"},
		{"negative amount", "send_usdc", `{"to":"` + sellerA + `","amount":"-1"}`, "not a plain decimal"},
		{"float elsewhere", "send_usdc", `{"to":"` + sellerA + `","amount":"0.25","options":{"fee":0.5}}`, "exactly"},
		{"extra key", "send_usdc", `{"to":"` + sellerA + `","amount":"0.25","recipient":"` + sellerB + `"}`, "not in the input schema"},
		{"cyrillic look-alike", "send_usdc", `{"to":"` + sellerA + `","amount":"0.25","t\u043e":"` + sellerB + `"}`, "ASCII"},
		{"zero-width key", "send_usdc", `{"to":"` + sellerA + `","amount":"0.25","to\u200b":"` + sellerB + `"}`, "ASCII"},
		{"case variant", "send_usdc", `{"to":"` + sellerA + `","amount":"0.25","Amount":"500"}`, "spelled in another case"},
		{"nested copy", "send_usdc", `{"to":"` + sellerA + `","amount":"0.25","options":{"amount":"500"}}`, "repeats the mapped name"},
		{"nested counterparty", "send_usdc", `{"to":"` + sellerA + `","amount":"0.25","options":{"x":{"TO":"` + sellerB + `"}}}`, "repeats the mapped name"},
		{"missing to", "send_usdc", `{"amount":"0.25"}`, "missing"},
		{"to as object", "send_usdc", `{"to":{"address":"` + sellerA + `"},"amount":"0.25"}`, "non-empty string"},
		{"huge integer", "pay_invoice", `{"payee":{"address":"` + sellerA + `"},"total":{"value":12345678901234567890,"token":"USDC"}}`, "exactly"},
		{"atomic with point", "pay_invoice", `{"payee":{"address":"` + sellerA + `"},"total":{"value":"2.5","token":"USDC"}}`, "integer count"},
		{"unknown asset atomic", "pay_invoice", `{"payee":{"address":"` + sellerA + `"},"total":{"value":"1","token":"DOGE"}}`, "not one the policy knows"},
		{"proto key", "send_usdc", `{"to":"` + sellerA + `","amount":"0.25","__proto__":{"amount":"9"}}`, "exactly"},
		{"not an object", "send_usdc", `["` + sellerA + `","0.25"]`, "object"},
	}
	for _, c := range cases {
		res := e.callRaw(t, c.tool, c.args)
		if !res.IsError || !strings.Contains(resultText(res), c.want) {
			t.Errorf("%s: want a tool error saying %q, got %v %s", c.name, c.want, res.IsError, resultText(res))
		}
	}
	if p := e.paid(t); len(p) != 0 {
		t.Fatalf("hostile spellings reached the upstream: %v", p)
	}
	// The same payment, spelled plainly, goes through.
	if res := e.callRaw(t, "send_usdc", `{"to":"`+sellerA+`","amount":"0.25","options":{"note":"ok"}}`); res.IsError {
		t.Fatalf("plain call: %s", resultText(res))
	}
}

func TestProxyUnmappedRefuseAndStartChecks(t *testing.T) {
	e := newProxyEnv(t, `{"tools": {"send_usdc": {"counterparty": "to", "amount": "amount", "amountUnit": "display"}}, "unmapped": "refuse"}`, "")
	e.start(t, nil)
	if res := e.callRaw(t, "echo", `{"text":"hi"}`); !res.IsError || !strings.Contains(resultText(res), "unmapped: refuse") {
		t.Fatalf("unmapped refuse: %s", resultText(res))
	}
	if res := e.callRaw(t, "send_usdc", `{"to":"`+sellerA+`","amount":"0.25"}`); res.IsError {
		t.Fatalf("mapped call: %s", resultText(res))
	}
	if n := len(e.paid(t)); n != 1 {
		t.Fatalf("upstream ran %d calls, want 1", n)
	}

	payUpstream(t)
	starts := []struct {
		name, gmap, want string
		env              []string
	}{
		{"missing tool", `{"tools": {"wire_money": {"counterparty": "to", "amount": "amount", "amountUnit": "display"}}}`, `names tool "wire_money", which the upstream does not list`, nil},
		{"path the schema cannot hold", `{"tools": {"send_usdc": {"counterparty": "payee.address", "amount": "amount", "amountUnit": "display"}}}`, `counterparty path "payee.address"`, nil},
		{"display amount in an integer", `{"tools": {"slow_send": {"counterparty": "to", "amount": "ms", "amountUnit": "display"}}}`, "cannot carry amount exactly", nil},
		{"unknown asset", `{"tools": {"send_usdc": {"counterparty": "to", "amount": "amount", "amountUnit": "display", "asset": "DOGE"}}}`, "neither an asset the policy knows", nil},
		{"unknown key", `{"tools": {"send_usdc": {"counterparty": "to", "amount": "amount", "amountUnit": "display", "payee": "x"}}}`, `unknown key "payee"`, nil},
		{"bad unit", `{"tools": {"send_usdc": {"counterparty": "to", "amount": "amount", "amountUnit": "cents"}}}`, "amountUnit", nil},
		{"name clash", `{"tools": {}}`, `tool "explain" has the name of one of this product's tools`, []string{"PAY_EXTRA=explain"}},
	}
	for _, s := range starts {
		env := newProxyEnv(t, s.gmap, "")
		cmd := env.command(s.env)
		cmd.Stdin = strings.NewReader("")
		var out bytes.Buffer
		cmd.Stdout = &out
		err := cmd.Run()
		if err == nil || !strings.Contains(env.stderr.String(), s.want) {
			t.Errorf("%s: want a refused start naming %q; err %v, stderr %s", s.name, s.want, err, env.stderr)
		}
	}
}

// The upstream's answer that it did not run a paying call releases what
// the call's allow reserved (the next call under the limit is allowed); a
// release line edited in the store is not honoured; SIGKILL of the
// upstream in the middle of a call releases nothing — the upstream may have
// paid before it died — so that payment counts until its reservation
// lapses.
func TestProxyUpstreamFailureAndKill(t *testing.T) {
	const sellerD = "0xC0FFEE0000000000000000000000000000000006"
	e := newProxyEnv(t, proxyMapJSON, `{"reviewAbove": "100", "perCounterpartyLimit": {"amount": "1.00", "windowHours": 24}, "reservationMinutes": 15}`)
	e.start(t, nil)
	pay := func(tool, amount string, extra ...string) *mcp.CallToolResult {
		return e.callRaw(t, tool, `{"to":"`+sellerD+`","amount":"`+amount+`"`+strings.Join(extra, "")+`}`)
	}
	// The upstream says the tool failed: the caller gets its answer, the
	// chain records FAILED after the ALLOWED decision, and the log a sealed
	// release of its reservation.
	res := pay("fail_send", "0.60")
	if !res.IsError || !strings.Contains(resultText(res), "insufficient funds") {
		t.Fatalf("failing upstream call: %s", resultText(res))
	}
	rs := chainReceipts(t, e.root)
	last := rs[len(rs)-1]
	if receiptField(last, "governance", "verdict") != "FAILED" || receiptField(last, "governance", "ruleId") != "upstream_tool_error" {
		t.Fatalf("last receipt after a failed call: %v", last)
	}
	// The release is a sealed entry of the spend ledger naming the outcome
	// receipt.
	ledgerPath := filepath.Join(e.root, "guard", "ledger.ndjson")
	data, err := os.ReadFile(ledgerPath)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(data, []byte(`"kind":"release"`))
	if i < 0 || !bytes.Contains(data[i:], []byte(`"receipt":"`+last["id"].(string)+`"`)) {
		t.Fatalf("no release naming the outcome receipt %v in the ledger:\n%s", last["id"], data)
	}
	// Whoever edits the release line (its seal) is seen by audit (the
	// ledger does not verify: exit 2), and by every process that reads the
	// ledger from then on.
	keyFile := filepath.Join(filepath.Dir(e.payLog), "signing-key.pem")
	if out, _, code := runCLI(t, "audit", "--dir", e.root, "--key-file", keyFile); code != 0 {
		t.Fatalf("audit before the edit: %d %s", code, out)
	}
	mac := bytes.LastIndex(data, []byte(`"mac":"`)) + len(`"mac":"`)
	edited := bytes.Clone(data)
	edited[mac] = map[bool]byte{true: '1', false: '0'}[edited[mac] == '0']
	if err := os.WriteFile(ledgerPath, edited, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, _, code := runCLI(t, "audit", "--dir", e.root, "--key-file", keyFile); code != 2 || !strings.Contains(out, "LEDGER") || !strings.Contains(out, "not sealed") {
		t.Fatalf("audit of an edited release: %d %s", code, out)
	}
	if err := os.WriteFile(ledgerPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	// Released: 0.60 fits under 1.00 again and is forwarded.
	if res := pay("send_usdc", "0.60"); res.IsError {
		t.Fatalf("the call after a released reservation was not forwarded: %s", resultText(res))
	}

	// SIGKILL of the upstream in the middle of a paying call: a clear
	// error, recorded as lost, and the upstream is restarted.
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		r, err := e.cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow_send", Arguments: json.RawMessage(`{"to":"` + sellerD + `","amount":"0.30","ms":5000}`)})
		if err != nil {
			t.Errorf("slow_send: %v", err)
		}
		done <- r
	}()
	time.Sleep(700 * time.Millisecond)
	pids := readPids(t, e.pidFile)
	if len(pids) != 1 {
		t.Fatalf("upstream pids %v", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r == nil || !r.IsError || !strings.Contains(resultText(r), "unknown") {
		t.Fatalf("killed mid-call: %+v", r)
	}
	rs = chainReceipts(t, e.root)
	if last := rs[len(rs)-1]; receiptField(last, "governance", "ruleId") != "upstream_lost" {
		t.Fatalf("last receipt after the kill: %v", last)
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(readPids(t, e.pidFile)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the upstream was not restarted; stderr %s", e.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The killed call's 0.30 still counts beside the 0.60 paid: 0.20 more
	// would pass 1.00 (and would fit had the kill released it).
	var d proxyDecision
	for time.Now().Before(deadline) {
		res := pay("send_usdc", "0.20")
		if res.IsError && res.StructuredContent != nil {
			d = decisionOf(t, res)
			break
		}
		if !res.IsError {
			t.Fatalf("the killed call's reservation was released: 0.20 more was forwarded")
		}
		time.Sleep(200 * time.Millisecond) // the restarted upstream is being checked
	}
	if d.Decision != "review" || !d.has("per_counterparty_limit") {
		t.Fatalf("after the kill: %+v", d)
	}
	// 0.10 fits exactly and reaches the restarted upstream.
	if res := pay("send_usdc", "0.10"); res.IsError {
		t.Fatalf("no call went through after the restart: %s; stderr %s", resultText(res), e.stderr)
	}
	for _, p := range e.paid(t) {
		if p["tool"] == "slow_send" {
			t.Fatalf("the killed call was carried out: %v", p)
		}
	}
	data, _ = os.ReadFile(ledgerPath)
	if n := bytes.Count(data, []byte(`"kind":"release"`)); n != 1 {
		t.Fatalf("%d releases in the spend ledger, want only the failed call's", n)
	}
}

// A paying tool whose error answers the guard map does not vouch for
// ("errors" absent, or "unknown") keeps its reservation after an isError
// answer: pay_then_fail pays and then says it failed, and the next call
// that fits only without that payment goes to review. The same failure of
// a tool mapped "errors": "unpaid" releases it (TestProxyUpstreamFailureAndKill).
func TestProxyToolErrorAfterPayingKeepsTheReservation(t *testing.T) {
	const sellerE = "0xC0FFEE0000000000000000000000000000000007"
	gmap := strings.Replace(proxyMapJSON, `"errors": "unpaid"`, `"errors": "unknown"`, 1)
	e := newProxyEnv(t, gmap, `{"reviewAbove": "100", "perCounterpartyLimit": {"amount": "1.00", "windowHours": 24}, "reservationMinutes": 15}`)
	e.start(t, nil)
	for i, tool := range []string{"pay_then_fail", "fail_send"} {
		res := e.callRaw(t, tool, `{"to":"`+sellerE+`","amount":"0.45"}`)
		if !res.IsError || res.StructuredContent != nil {
			t.Fatalf("%s: want the upstream's own error answer, got %s", tool, resultText(res))
		}
		rs := chainReceipts(t, e.root)
		last := rs[len(rs)-1]
		if receiptField(last, "governance", "verdict") != "FAILED" || receiptField(last, "governance", "ruleId") != "upstream_tool_error_unknown" {
			t.Fatalf("%s: last receipt %v, want FAILED upstream_tool_error_unknown", tool, last)
		}
		data, err := os.ReadFile(filepath.Join(e.root, "guard", "ledger.ndjson"))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte(`"kind":"release"`)) {
			t.Fatalf("after %s (call %d) a commitment was released:\n%s", tool, i, data)
		}
	}
	// pay_then_fail did pay: the upstream's log shows it.
	if paid := e.paid(t); len(paid) != 1 || paid[0]["tool"] != "pay_then_fail" {
		t.Fatalf("the upstream carried out %v, want pay_then_fail once", paid)
	}
	// 0.45 + 0.45 held; 0.15 more passes 1.00 and goes to review, where it
	// would fit had an error answer released either reservation.
	if d := decisionOf(t, e.callRaw(t, "send_usdc", `{"to":"`+sellerE+`","amount":"0.15"}`)); d.Decision != "review" || !d.has("per_counterparty_limit") {
		t.Fatalf("the call after two unknown errors: %+v", d)
	}
	if res := e.callRaw(t, "send_usdc", `{"to":"`+sellerE+`","amount":"0.10"}`); res.IsError {
		t.Fatalf("0.10 fits beside the two kept reservations: %s", resultText(res))
	}
}

func (d proxyDecision) has(rule string) bool {
	for _, r := range d.Reasons {
		if r.Rule == rule {
			return true
		}
	}
	return false
}

func readPids(t *testing.T, path string) []int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []int
	for _, l := range strings.Fields(string(data)) {
		n, err := strconv.Atoi(l)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

func TestProxyPassesThroughProgressCancellationAndListChanges(t *testing.T) {
	e := newProxyEnv(t, proxyMapJSON, "")
	var mu sync.Mutex
	var progress []float64
	listChanged := make(chan struct{}, 4)
	logs := make(chan string, 4)
	e.start(t, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			progress = append(progress, r.Params.Progress)
			mu.Unlock()
		},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { listChanged <- struct{}{} },
		//lint:ignore SA1019 log messages of a session-protocol upstream must still pass through
		LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) {
			logs <- string(mustJSON(r.Params.Data))
		},
	}, "PAY_PAGE=2")
	ctx := context.Background()
	// Pagination: the upstream pages its tools two at a time; all are served.
	lt, err := e.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(lt.Tools) != payUpstreamTools+4 {
		t.Fatalf("tools/list through the proxy: %d tools, want %d upstream + 4 read tools", len(lt.Tools), payUpstreamTools)
	}
	if err := e.cs.Ping(ctx, nil); err != nil {
		t.Fatalf("ping: %v", err)
	}
	// Progress of a forwarded paying call reaches the caller.
	params := &mcp.CallToolParams{Name: "slow_send", Arguments: json.RawMessage(`{"to":"` + sellerA + `","amount":"0.25","ms":400}`)}
	params.SetProgressToken("tok-1")
	res, err := e.cs.CallTool(ctx, params)
	if err != nil || res.IsError {
		t.Fatalf("slow_send: %v %v", err, res)
	}
	mu.Lock()
	n := len(progress)
	mu.Unlock()
	if n < 3 {
		t.Fatalf("%d progress notifications reached the caller, want several", n)
	}
	// A log message of the upstream reaches the client.
	if res := e.callRaw(t, "echo", `{"text":"x"}`); res.IsError {
		t.Fatal(resultText(res))
	}
	select {
	case m := <-logs:
		if !strings.Contains(m, "echoed") {
			t.Fatalf("log message %s", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream's log message did not reach the client")
	}
	// Cancellation reaches the upstream: the cancelled call pays nothing.
	cctx, cancel := context.WithCancel(ctx)
	go func() { time.Sleep(300 * time.Millisecond); cancel() }()
	_, err = e.cs.CallTool(cctx, &mcp.CallToolParams{Name: "slow_send", Arguments: json.RawMessage(`{"to":"` + sellerA + `","amount":"0.30","ms":1500}`)})
	if err == nil {
		t.Fatal("the cancelled call answered")
	}
	time.Sleep(2 * time.Second)
	for _, p := range e.paid(t) {
		if strings.Contains(string(mustJSON(p["arguments"])), `"0.30"`) {
			t.Fatal("the upstream carried out a cancelled call")
		}
	}
	// listChanged: the upstream drops a mapped tool; the map is checked
	// again, the client hears of it, and every upstream call is refused.
	if res := e.callRaw(t, "change_tools", `{"remove":true}`); res.IsError {
		t.Fatal(resultText(res))
	}
	select {
	case <-listChanged:
	case <-time.After(10 * time.Second):
		t.Fatalf("no tools/list_changed reached the client; stderr %s", e.stderr)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		res := e.callRaw(t, "echo", `{"text":"x"}`)
		if res.IsError && strings.Contains(resultText(res), "no longer match the guard map") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("calls still forwarded after the map broke: %s", resultText(res))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startHTTPUpstream runs the test upstream over Streamable HTTP with one
// bearer token, and returns its /mcp URL.
func startHTTPUpstream(t *testing.T, payLog, token string) string {
	t.Helper()
	bin := payUpstream(t)
	addrFile := filepath.Join(t.TempDir(), "addr")
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "PAY_LOG="+payLog, "PAY_HTTP=127.0.0.1:0", "PAY_ADDR_FILE="+addrFile, "PAY_TOKEN="+token)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(addrFile); err == nil {
			return "http://" + string(b) + "/mcp"
		}
		if time.Now().After(deadline) {
			t.Fatal("the HTTP upstream did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The proxy over Streamable HTTP, with the server's authentication, in
// front of a Streamable HTTP upstream that wants a bearer token: the
// caller in the receipts is the token's subject.
func TestProxyOverHTTPWithHTTPUpstream(t *testing.T) {
	e := newProxyEnv(t, proxyMapJSON, "")
	upstreamURL := startHTTPUpstream(t, e.payLog, "upstream-secret")
	tokenFile := writeFile(t, "upstream-token", "upstream-secret\n")
	dir := t.TempDir()
	iss, err := authtest.NewIssuer(dir, "https://as.test.example", "")
	if err != nil {
		t.Fatal(err)
	}
	p := startHTTPCommand(t, "proxy", "--http", "127.0.0.1:0", "--dir", e.root, "--key-file", filepath.Join(dir, "signing.pem"),
		"--guard-map", e.mapPath, "--upstream-url", upstreamURL, "--upstream-token-file", tokenFile,
		"--auth-issuer", iss.Issuer, "--auth-jwks", iss.JWKSPath, "--auth-scope", "trace:read", "--auth-tool-scope", "send_usdc=wallet:send")
	iss.Resource = p.resource
	// A per-tool scope names an upstream tool like one of the server's.
	narrow, err := iss.Token("agent-http", []string{"trace:read"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ncs, err := httpSession(t, p.resource, func() string { return narrow })
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, p.logs())
	}
	if _, err := ncs.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_usdc", Arguments: map[string]any{"to": sellerA, "amount": "0.25"}}); err == nil {
		t.Fatal("send_usdc without its tool scope went through")
	}
	tok, err := iss.Token("agent-http", []string{"trace:read", "wallet:send"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := httpSession(t, p.resource, func() string { return tok })
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, p.logs())
	}
	e.cs = cs
	if res := e.callRaw(t, "send_usdc", `{"to":"`+sellerA+`","amount":"0.25"}`); res.IsError {
		t.Fatalf("allowed call over HTTP: %s\n%s", resultText(res), p.logs())
	}
	if d := decisionOf(t, e.callRaw(t, "send_usdc", `{"to":"`+sellerB+`","amount":"0.10"}`)); d.Decision != "review" {
		t.Fatalf("review over HTTP: %+v", d)
	}
	if n := len(e.paid(t)); n != 1 {
		t.Fatalf("upstream ran %d calls, want 1", n)
	}
	var agents []string
	for _, r := range chainReceipts(t, e.root) {
		agents = append(agents, receiptField(r, "agent", "id"))
	}
	// The decision, the outcome and the review (with its signed terms).
	if len(agents) < 3 || strings.Trim(strings.ReplaceAll(strings.Join(agents, ","), "agent-http", ""), ",") != "" {
		t.Fatalf("callers in the chain: %v, want the token's subject on every receipt", agents)
	}
	// Without a token the proxy's /mcp answers 401 like the server's.
	if status, _ := rawInitialize(t, p.resource, ""); status != http.StatusUnauthorized {
		t.Fatalf("no token: %d", status)
	}

	// A wrong upstream token stops the start with the reason.
	bad := writeFile(t, "bad-token", "wrong")
	_, errOut, code := runCLI(t, "proxy", "--dir", e.root, "--key-file", filepath.Join(dir, "signing.pem"),
		"--guard-map", e.mapPath, "--upstream-url", upstreamURL, "--upstream-token-file", bad)
	if code == 0 || !strings.Contains(errOut, "upstream") {
		t.Fatalf("wrong upstream token: exit %d, %s", code, errOut)
	}
}

// everythingServer is Node and the entry point of server-everything, from
// HAIA_NODE and HAIA_EVERYTHING, which tools/ci-node.sh sets when it runs
// the tests that need them; elsewhere it skips t saying so.
func everythingServer(t *testing.T) (node, entry string) {
	t.Helper()
	node, entry = os.Getenv("HAIA_NODE"), os.Getenv("HAIA_EVERYTHING")
	if node == "" || entry == "" {
		t.Skip("HAIA_NODE and HAIA_EVERYTHING are not set: tools/ci-node.sh installs Node 22 and server-everything and runs this test")
	}
	return node, entry
}

// The official reference server, @modelcontextprotocol/server-everything
// (pinned in tools/everything, installed by tools/ci-node.sh), behind the
// proxy: everything that is not a payment passes through as it is.
func TestProxyEverythingPassesThrough(t *testing.T) {
	node, entry := everythingServer(t)
	ctx := context.Background()
	connect := func(cmd *exec.Cmd, opts *mcp.ClientOptions) *mcp.ClientSession {
		client := mcp.NewClient(&mcp.Implementation{Name: "e2e-everything", Version: "1"}, opts)
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		cs, err := client.Connect(cctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatalf("connect %v: %v (stderr: %v)", cmd.Args, err, cmd.Stderr)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	// Both clients declare sampling, elicitation and roots, as the proxy's
	// upstream client does, so server-everything offers both the same.
	var host everythingHost
	direct := connect(exec.Command(node, entry, "stdio"), host.options())
	e := newProxyEnv(t, `{"tools": {}, "unmapped": "forward"}`, "")
	cmd := exec.Command(binPath, append(e.args(), "--", node, entry, "stdio")...)
	cmd.Stderr = e.stderr
	proxied := connect(cmd, host.options())

	// The same tools with the same schemas, plus this product's read tools.
	want, err := direct.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := proxied.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	gotBy := map[string]*mcp.Tool{}
	for _, tool := range got.Tools {
		gotBy[tool.Name] = tool
	}
	wantTools := want.Tools
	if len(got.Tools) != len(wantTools)+4 {
		t.Errorf("%d tools through the proxy, want %d upstream + 4", len(got.Tools), len(wantTools))
	}
	for _, w := range wantTools {
		g := gotBy[w.Name]
		if g == nil {
			t.Errorf("tool %s missing through the proxy", w.Name)
			continue
		}
		if a, b := mustJSON(w.InputSchema), mustJSON(g.InputSchema); !bytes.Equal(a, b) {
			t.Errorf("tool %s: input schema changed:\n%s\n%s", w.Name, a, b)
		}
		if a, b := mustJSON(w.OutputSchema), mustJSON(g.OutputSchema); !bytes.Equal(a, b) {
			t.Errorf("tool %s: output schema changed", w.Name)
		}
		if w.Description != g.Description {
			t.Errorf("tool %s: description changed", w.Name)
		}
	}
	// The same answers.
	for _, c := range []struct {
		name string
		args map[string]any
	}{
		{"echo", map[string]any{"message": "through the guard"}},
		{"get-sum", map[string]any{"a": 2, "b": 40}},
		{"get-structured-content", map[string]any{"location": "New York"}},
	} {
		a, err := direct.CallTool(ctx, &mcp.CallToolParams{Name: c.name, Arguments: c.args})
		if err != nil {
			t.Fatal(err)
		}
		b, err := proxied.CallTool(ctx, &mcp.CallToolParams{Name: c.name, Arguments: c.args})
		if err != nil {
			t.Fatalf("%s through the proxy: %v (stderr %s)", c.name, err, e.stderr)
		}
		if !bytes.Equal(mustJSON(a.Content), mustJSON(b.Content)) || !bytes.Equal(mustJSON(a.StructuredContent), mustJSON(b.StructuredContent)) || a.IsError != b.IsError {
			t.Errorf("%s: direct %s / %s, proxied %s / %s", c.name, mustJSON(a.Content), mustJSON(a.StructuredContent), mustJSON(b.Content), mustJSON(b.StructuredContent))
		}
	}
	// Progress of a long operation reaches the caller with its own token,
	// every notification before the result (read on the wire, in order).
	wcmd := exec.Command(binPath, append(e.args(), "--", node, entry, "stdio")...)
	wcmd.Stderr = e.stderr
	w := startWire(t, wcmd)
	w.initialize(t, map[string]any{"roots": map[string]any{"listChanged": true}})
	for i := range 3 {
		token := "everything-" + strconv.Itoa(i)
		before, res := w.request(t, "tools/call", map[string]any{"name": "trigger-long-running-operation",
			"arguments": map[string]any{"duration": 0.4, "steps": 4}, "_meta": map[string]any{"progressToken": token}})
		if res["isError"] == true {
			t.Fatalf("long-running operation: %v", res)
		}
		got := notificationsOf(before, "notifications/progress")
		if len(got) != 4 {
			t.Fatalf("run %d: %d progress notifications before the result, want 4: %v", i, len(got), before)
		}
		for j, n := range got {
			p, _ := n["params"].(map[string]any)
			if p["progressToken"] != token || p["progress"] != float64(j+1) {
				t.Fatalf("run %d: progress %d: %v, want the caller's own token in order", i, j, p)
			}
		}
	}
	if err := proxied.Ping(ctx, nil); err != nil {
		t.Fatal(err)
	}
	everythingExtras(t, direct, proxied, &host)
	everythingWire(t, w)
	dcmd := exec.Command(node, entry, "stdio")
	dcmd.Stderr = &lockedBuffer{}
	// A proxy of its own (its own Trace root), beside the two still open.
	te := newProxyEnv(t, `{"tools": {}, "unmapped": "forward"}`, "")
	pcmd := exec.Command(binPath, append(te.args(), "--", node, entry, "stdio")...)
	pcmd.Stderr = te.stderr
	everythingTasks(t, startWire(t, dcmd), startWire(t, pcmd))
}

// An upstream whose tool list changes while the proxy starts (before its
// initialize answer, once initialized, during the first tools/list) is read
// again before the proxy serves; the proxy neither crashes nor serves a
// stale list, and a paying call goes through the guard as usual.
func TestProxyUpstreamChangingAtTheStart(t *testing.T) {
	for i := range 3 {
		e := newProxyEnv(t, proxyMapJSON, "")
		e.start(t, nil, "PAY_EARLY_CHANGES=1")
		lt, err := e.cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatalf("start %d: %v (stderr %s)", i, err, e.stderr)
		}
		if len(lt.Tools) == 0 || !slices.ContainsFunc(lt.Tools, func(tool *mcp.Tool) bool { return tool.Name == "send_usdc" }) {
			t.Fatalf("start %d: tools/list lacks send_usdc: %v", i, lt.Tools)
		}
		res := e.callRaw(t, "send_usdc", `{"to":"`+sellerA+`","amount":"0.25"}`)
		if res.IsError || !strings.Contains(resultText(res), "paid by send_usdc") {
			t.Fatalf("start %d: allowed call: %s (stderr %s)", i, resultText(res), e.stderr)
		}
		stderr := e.stderr.String()
		if strings.Contains(stderr, "panic: ") || strings.Contains(stderr, "DATA RACE") {
			t.Fatalf("start %d: the proxy crashed:\n%s", i, stderr)
		}
		// The change announced during the first tools/list is read again.
		if n := strings.Count(stderr, `"msg":"upstream tools served"`); n < 2 {
			t.Fatalf("start %d: the upstream's tools were read %d times, want the change during the start read again:\n%s", i, n, stderr)
		}
	}
}

// Ten paying calls of 1.00 at once under a per-counterparty limit of 5.00:
// every allow reserves its payment inside the decision's lock, so at most
// five reach the upstream.
func TestProxyConcurrentPayingCallsHoldTheLimit(t *testing.T) {
	const sellerC = "0xC0FFEE0000000000000000000000000000000004"
	e := newProxyEnv(t, proxyMapJSON, `{"perCounterpartyLimit": {"amount": "5.00", "windowHours": 24}, "reviewAbove": "100", "reservationMinutes": 15}`)
	payUpstream(t)
	e.start(t, nil)
	var wg sync.WaitGroup
	results := make([]*mcp.CallToolResult, 10)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res, err := e.cs.CallTool(ctx, &mcp.CallToolParams{Name: "send_usdc", Arguments: json.RawMessage(`{"to":"` + sellerC + `","amount":"1.00","memo":"` + strconv.Itoa(i) + `"}`)})
			if err != nil {
				t.Errorf("call %d: %v", i, err)
			}
			results[i] = res
		}()
	}
	wg.Wait()
	forwarded := 0
	for _, r := range results {
		if r != nil && !r.IsError {
			forwarded++
		}
	}
	paid := len(e.paid(t))
	if paid > 5 || paid != forwarded || paid == 0 {
		t.Fatalf("%d calls reached the upstream (%d answered as forwarded), want between 1 and 5", paid, forwarded)
	}
}

// One proxy, one upstream, tenants kept apart: each tenant's calls are
// judged by its own guard (its policy layer, its review log and chain).
func TestProxyTenants(t *testing.T) {
	const sellerC = "0xC0FFEE0000000000000000000000000000000005"
	tenants := filepath.Join(t.TempDir(), "tenants")
	for _, name := range []string{"acme", "globex"} {
		rec, err := simrec.New(filepath.Join(tenants, name), "run-"+name, time.Now().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if err := rec.Pay(simrec.Payment{OperationID: "op-" + name, URL: "https://" + name + ".example/x", PayTo: sellerA, Amount: "100000", Outcome: "settled"}); err != nil {
			t.Fatal(err)
		}
	}
	e := newProxyEnv(t, proxyMapJSON, `{"tenants": {"acme": {"reviewAbove": "0.05"}}}`)
	dir := t.TempDir()
	secret := []byte(strings.Repeat("p", 48))
	secretFile := writeFile(t, "secret", string(secret))
	payUpstream(t)
	p := startHTTPCommandEnv(t, []string{"PAY_LOG=" + e.payLog}, "proxy", "--http", "127.0.0.1:0", "--tenants-dir", tenants, "--tenant-claim", "org",
		"--guard-config", e.config, "--guard-map", e.mapPath, "--key-file", filepath.Join(dir, "signing.pem"),
		"--auth-issuer", "http://127.0.0.1/local-as", "--auth-hmac-secret", secretFile, "--", payUpstreamBin)
	session := func(tenant string) *proxyEnv {
		tok := signHS256(t, secret, map[string]any{"iss": "http://127.0.0.1/local-as", "aud": p.resource, "sub": "agent-1",
			"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix(), "org": tenant})
		cs, err := httpSession(t, p.resource, func() string { return tok })
		if err != nil {
			t.Fatalf("connect as %s: %v\n%s", tenant, err, p.logs())
		}
		return &proxyEnv{cs: cs, stderr: e.stderr}
	}
	acme, globex := session("acme"), session("globex")
	args := `{"to":"` + sellerC + `","amount":"0.10"}`
	d := decisionOf(t, acme.callRaw(t, "send_usdc", args))
	if d.Decision != "review" {
		t.Fatalf("acme (reviewAbove 0.05): %+v", d)
	}
	if res := globex.callRaw(t, "send_usdc", args); res.IsError {
		t.Fatalf("globex: %s\n%s", resultText(res), p.logs())
	}
	if n := len(e.paid(t)); n != 1 {
		t.Fatalf("upstream ran %d calls, want globex's one", n)
	}
	if res := globex.callRaw(t, "get_review_status", `{"review_id":"`+d.ReviewID+`"}`); !res.IsError {
		t.Fatalf("globex reads acme's review: %s", resultText(res))
	}
	if res := acme.callRaw(t, "get_review_status", `{"review_id":"`+d.ReviewID+`"}`); res.IsError {
		t.Fatalf("acme's own review: %s", resultText(res))
	}
}

// An upstream that exits is restarted with backoff (--upstream-restart,
// the default): while its restarts fail the waits double from 0.5 s, every
// call is refused with the reason and nothing is forwarded; once it starts
// again its tools are checked and calls go through. With
// --upstream-restart=false it stays down and every call says so.
func TestProxyUpstreamRestartBackoff(t *testing.T) {
	e := newProxyEnv(t, proxyMapJSON, "")
	refuse := filepath.Join(t.TempDir(), "refuse")
	e.start(t, nil, "PAY_REFUSE_FILE="+refuse)
	if res := e.callRaw(t, "echo", `{"text":"before"}`); res.IsError {
		t.Fatalf("echo: %s", resultText(res))
	}
	if err := os.WriteFile(refuse, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	pids := readPids(t, e.pidFile)
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Three failed restarts: waits of 0.5, 1 and 2 s are logged, then 4 s.
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(e.stderr.String(), `"in":4000000000`) {
		if time.Now().After(deadline) {
			t.Fatalf("no doubling backoff in the proxy's log:\n%s", e.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, wait := range []string{`"in":500000000`, `"in":1000000000`, `"in":2000000000`} {
		if !strings.Contains(e.stderr.String(), wait) {
			t.Errorf("the backoff did not wait %s", wait)
		}
	}
	if n := strings.Count(e.stderr.String(), "upstream restart failed"); n < 3 {
		t.Errorf("%d failed restarts logged, want 3 or more", n)
	}
	for _, tool := range []string{"send_usdc", "echo"} {
		res := e.callRaw(t, tool, `{"to":"`+sellerA+`","amount":"0.01","text":"x"}`)
		if !res.IsError || !strings.Contains(resultText(res), "not forwarded") {
			t.Fatalf("%s while the upstream is down: %s", tool, resultText(res))
		}
	}
	// It starts again: its tools are checked, and calls go through.
	if err := os.Remove(refuse); err != nil {
		t.Fatal(err)
	}
	for {
		res := e.callRaw(t, "send_usdc", `{"to":"`+sellerA+`","amount":"0.01"}`)
		if !res.IsError {
			break
		}
		if time.Now().After(deadline.Add(30 * time.Second)) {
			t.Fatalf("no call went through after the upstream could start again: %s\n%s", resultText(res), e.stderr)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := len(e.paid(t)); n != 1 {
		t.Fatalf("the upstream carried out %d calls, want the one after its restart", n)
	}

	// --upstream-restart=false: an upstream that exits stays down.
	off := newProxyEnv(t, proxyMapJSON, "")
	payUpstream(t)
	cmd := exec.Command(binPath, append(off.args("--upstream-restart=false"), "--", payUpstreamBinPath())...)
	cmd.Env = append(os.Environ(), "PAY_LOG="+off.payLog, "PAY_PID_FILE="+off.pidFile)
	cmd.Stderr = off.stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-proxy", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect: %v (stderr %s)", err, off.stderr)
	}
	defer cs.Close()
	off.cs = cs
	if err := syscall.Kill(readPids(t, off.pidFile)[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(off.stderr.String(), "not restarting") {
		if time.Now().After(deadline.Add(time.Minute)) {
			t.Fatalf("no word of the exit: %s", off.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	if res := off.callRaw(t, "echo", `{"text":"x"}`); !res.IsError || !strings.Contains(resultText(res), "not forwarded") {
		t.Fatalf("a call after the upstream exited without restart: %s", resultText(res))
	}
	if n := len(readPids(t, off.pidFile)); n != 1 {
		t.Fatalf("the upstream was started %d times with --upstream-restart=false", n)
	}
}

// A proxy killed as soon as it has answered a paying call — before the
// call's outcome receipt, which it signs after the answer, may be on disk —
// leaves the payment counted: the proxy started again on the same root
// answers review to a second payment over the limit, and audit reports no
// tampering (at worst what a crash leaves, exit 4).
func TestProxyKilledAfterAnsweringKeepsTheSpend(t *testing.T) {
	e := newProxyEnv(t, proxyMapJSON, `{"reviewAbove": "100", "perCounterpartyLimit": {"amount": "5.00", "windowHours": 24}, "reservationMinutes": 1}`)
	e.start(t, nil)
	if res := e.callRaw(t, "send_usdc", `{"to":"`+sellerA+`","amount":"4.00"}`); res.IsError {
		t.Fatalf("the first payment: %s", resultText(res))
	}
	if err := e.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, _ = e.cmd.Process.Wait() // its upstream, which holds its stderr, exits on its own
	e.start(t, nil)
	if d := decisionOf(t, e.callRaw(t, "send_usdc", `{"to":"`+sellerA+`","amount":"4.00"}`)); d.Decision != "review" {
		t.Fatalf("after the kill, a second 4.00 under 5.00 a day: %+v", d)
	}
	if n := len(e.paid(t)); n != 1 {
		t.Fatalf("the upstream ran %d paying calls, want 1", n)
	}
	keyFile := filepath.Join(filepath.Dir(e.payLog), "signing-key.pem")
	if out, _, code := runCLI(t, "audit", "--dir", e.root, "--key-file", keyFile); code != 0 && code != 4 {
		t.Fatalf("audit after the kill: %d %s", code, out)
	}
}
