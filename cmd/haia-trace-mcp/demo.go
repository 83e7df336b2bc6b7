package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
)

// The demo's two simulated sellers.
const (
	demoSellerSettles = "0x5e11e4000000000000000000000000000000a001"
	demoSellerSilent  = "0x5e11e4000000000000000000000000000000b002"
)

const demoDetails = `Plays the whole story on a simulated Trace root and prints a transcript: an
agent pays two sellers, one never settles; check_before_pay says review; a
human rejects it with a key of their own; the rejection holds; the agent,
which holds no wallet key, pays through authorize_payment, which signs only
what the guard allows; audit and verify are clean. Only the money is
simulated.
exit codes: 0 the story held, 1 it did not, 2 usage
`

// defineDemo plays the product's story on a fresh, simulated Trace root:
// only the money is simulated; the recorder lines, the server, the MCP
// client, the review CLI and the verifier are the real ones.
func defineDemo(fs *flag.FlagSet) runFunc {
	keep := fs.String("keep", "", "build the demo in `DIR` (must not exist) and keep it afterwards")
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		return runDemo(ctx, env.stdout, env.stderr, keep)
	}
}

func runDemo(ctx context.Context, stdout, stderr io.Writer, keep *string) error {
	base := *keep
	if base == "" {
		dir, err := os.MkdirTemp("", "haia-trace-demo-")
		if err != nil {
			fmt.Fprintf(stderr, "demo: %v\n", err)
			return exitCode(exitFail)
		}
		defer os.RemoveAll(dir)
		base = dir
	} else if err := os.Mkdir(base, 0o700); err != nil {
		fmt.Fprintf(stderr, "demo: --keep %s: %v (choose a directory that does not exist yet)\n", base, err)
		return exitCode(exitFail)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "demo: cannot find this program's path to start the server: %v\n", err)
		return exitCode(exitFail)
	}
	d := &demo{
		self: self, out: stdout,
		root:        filepath.Join(base, ".trace"),
		key:         filepath.Join(base, "keys", "signing-key.pem"),
		reviewerKey: filepath.Join(base, "keys", "reviewer-key.pem"),
		reviewers:   filepath.Join(base, "keys", "reviewers.json"),
	}
	if err := d.run(ctx); err != nil {
		fmt.Fprintf(stdout, "\nDEMO FAILED: %v\n", err)
		return exitCode(exitFail)
	}
	if *keep != "" {
		fmt.Fprintf(stdout, "\nThe demo's files are kept in %s (Trace root %s, signing key %s).\n", base, d.root, d.key)
	}
	return nil
}

type demo struct {
	self, root, key        string
	reviewerKey, reviewers string
	payerKey               string
	out                    io.Writer
	client                 *mcpclient.Client
	step                   int
}

func (d *demo) say(format string, a ...any) { fmt.Fprintf(d.out, format+"\n", a...) }

func (d *demo) heading(format string, a ...any) {
	d.step++
	fmt.Fprintf(d.out, "\n== %d. %s\n", d.step, fmt.Sprintf(format, a...))
}

func (d *demo) run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	d.say("haia-trace-mcp demo: an agent pays two sellers; one never settles.")
	d.say("Only the money is simulated. The recorder lines, the MCP server, the MCP client,")
	d.say("the review command and the verifier below are the real ones.")

	d.heading("The agent's recorder writes its Trace run (%s)", filepath.Join(d.root, "events"))
	if err := os.MkdirAll(filepath.Dir(d.key), 0o700); err != nil {
		return err
	}
	rec, err := simrec.New(d.root, "run-demo", time.Now().Add(-5*time.Minute))
	if err != nil {
		return err
	}
	for _, p := range []simrec.Payment{
		{OperationID: "op-1", URL: "https://reports.example.com/weekly", PayTo: demoSellerSettles, Amount: "250000", Outcome: "settled"},
		{OperationID: "op-2", URL: "https://quotes.example.net/live", PayTo: demoSellerSilent, Amount: "400000", Outcome: "unsettled"},
	} {
		if err := rec.Pay(p); err != nil {
			return err
		}
		d.say("  %s: paid %s to %s for %s — %s", p.OperationID, demoAmount(p.Amount, guard.USDCBase), p.PayTo, p.URL, map[string]string{
			"settled": "the settlement response came back", "unsettled": "no settlement response ever arrived"}[p.Outcome])
	}

	d.heading("The operator makes a reviewer key and trusts it (once)")
	if _, err := d.cli(ctx, "reviewer", "init", "--id", "operator", "--key-file", d.reviewerKey, "--reviewers", d.reviewers); err != nil {
		return err
	}

	d.heading("The agent host starts the MCP server over stdio")
	payerKey := filepath.Join(filepath.Dir(d.key), "payer.key")
	if err := writeDemoPayerKey(payerKey); err != nil {
		return err
	}
	d.payerKey = payerKey
	// The reviewer console serves beside the guard, on a free loopback
	// port: every review answer links to its page there.
	serverArgs := []string{"--dir", d.root, "--key-file", d.key, "--reviewers", d.reviewers, "--agent-id", "demo-agent", "--log-level", "warn",
		"--payer-key", payerKey, "--console", "--console-addr", "127.0.0.1:0"}
	d.say("  $ haia-trace-mcp %s", shellJoin(serverArgs))
	client, err := mcpclient.NewStdioMCPClient(d.self, os.Environ(), serverArgs...)
	if err != nil {
		return fmt.Errorf("start the server: %w", err)
	}
	defer client.Close()
	if stderr, ok := mcpclient.GetStderr(client); ok {
		go io.Copy(io.Discard, stderr)
	}
	d.client = client
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "haia-trace-mcp-demo", Version: "1"}
	info, err := client.Initialize(ctx, init)
	if err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	tools, err := client.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		return fmt.Errorf("list tools: %w", err)
	}
	var names []string
	for _, t := range tools.Tools {
		names = append(names, t.Name)
	}
	d.say("  connected to %s; tools: %s", info.ServerInfo.Name, strings.Join(names, ", "))
	d.say("  (there is no tool that approves or rejects a review: that is the human's job)")

	d.heading("The agent lists its operations")
	var list struct {
		Operations []struct {
			RunID         string   `json:"run_id"`
			OperationID   string   `json:"operation_id"`
			Completeness  string   `json:"completeness"`
			MissingStages []string `json:"missing_stages"`
		} `json:"operations"`
	}
	if err := d.call(ctx, "list_operations", map[string]any{}, &list); err != nil {
		return err
	}
	for _, op := range list.Operations {
		missing := ""
		if len(op.MissingStages) > 0 {
			missing = " (missing: " + strings.Join(op.MissingStages, ", ") + ")"
		}
		d.say("  %s / %s: %s%s", op.RunID, op.OperationID, op.Completeness, missing)
	}

	d.heading("Before paying the silent seller again, the agent asks check_before_pay")
	var check struct {
		Decision string `json:"decision"`
		Reasons  []struct {
			Rule   string `json:"rule"`
			Detail string `json:"detail"`
		} `json:"reasons"`
		ReviewID  string `json:"review_id"`
		ReviewURL string `json:"review_url"`
		ReceiptID string `json:"receipt_id"`
	}
	if err := d.call(ctx, "check_before_pay", map[string]any{"counterparty": demoSellerSilent, "amount": "0.40", "asset": "USDC"}, &check); err != nil {
		return err
	}
	d.say("  decision: %s   review_id: %s", strings.ToUpper(check.Decision), check.ReviewID)
	for _, r := range check.Reasons {
		d.say("  - %s: %s", r.Rule, r.Detail)
	}
	if check.Decision != "review" || check.ReviewID == "" {
		return fmt.Errorf("expected a review for the silent seller, got %q", check.Decision)
	}
	consoleURL, ok := strings.CutSuffix(check.ReviewURL, "reviews/"+check.ReviewID)
	if !ok {
		return fmt.Errorf("expected the review's console page in review_url, got %q", check.ReviewURL)
	}
	d.say("  review_url: %s", check.ReviewURL)
	d.say("  (the reviewer console: a reviewer whose passkey the operator enrolled — haia-trace-mcp reviewer passkey add —")
	d.say("   signs in there and approves or rejects with the passkey; docs/console.md. This demo decides with a key.)")

	rejected := check.ReviewID
	d.heading("A human reviews it from the command line and rejects it")
	if _, err := d.cli(ctx, "review", "list", "--dir", d.root, "--reviewers", d.reviewers, "--console-url", consoleURL); err != nil {
		return err
	}
	if _, err := d.cli(ctx, "review", "show", check.ReviewID, "--dir", d.root, "--reviewers", d.reviewers); err != nil {
		return err
	}
	if _, err := d.cli(ctx, "review", "reject", check.ReviewID, "--note", "op-2 never settled; ask the seller first",
		"--dir", d.root, "--reviewer-key", d.reviewerKey, "--reviewers", d.reviewers); err != nil {
		return err
	}

	d.heading("The agent reads the decision and the explanation")
	var status struct {
		Status   string   `json:"status"`
		Note     string   `json:"note"`
		Receipts []string `json:"receipts"`
	}
	if err := d.call(ctx, "get_review_status", map[string]any{"review_id": check.ReviewID}, &status); err != nil {
		return err
	}
	d.say("  review %s: %s — %q (signed receipts: %s)", check.ReviewID, status.Status, status.Note, strings.Join(status.Receipts, ", "))
	if status.Status != "rejected" {
		return fmt.Errorf("expected the review to be rejected, got %q", status.Status)
	}
	var ex struct {
		Explanation string `json:"explanation"`
	}
	if err := d.call(ctx, "explain", map[string]any{"run_id": "run-demo", "operation_id": "op-2"}, &ex); err != nil {
		return err
	}
	d.say("  explain run-demo/op-2: %s", ex.Explanation)
	var again struct {
		Decision string `json:"decision"`
		Reasons  []struct {
			Rule string `json:"rule"`
		} `json:"reasons"`
	}
	if err := d.call(ctx, "check_before_pay", map[string]any{"counterparty": demoSellerSilent, "amount": "0.40", "asset": "USDC"}, &again); err != nil {
		return err
	}
	d.say("  asking the very same question again: %s (%s) — the rejection holds", strings.ToUpper(again.Decision), again.Reasons[0].Rule)
	if again.Decision != "block" || again.Reasons[0].Rule != "human_rejected" {
		return fmt.Errorf("expected the rejection to hold, got %q", again.Decision)
	}

	d.heading("Paying the seller that settles is fine")
	if err := d.call(ctx, "check_before_pay", map[string]any{"counterparty": demoSellerSettles, "amount": "0.25"}, &check); err != nil {
		return err
	}
	d.say("  decision: %s", strings.ToUpper(check.Decision))
	if check.Decision != "allow" {
		return fmt.Errorf("expected allow for the settled seller, got %q", check.Decision)
	}

	d.heading("The agent holds no wallet key: it pays a seller's 402 through authorize_payment")
	payer, err := d.cli(ctx, "payer", "address", "--payer-key", d.payerKey)
	if err != nil {
		return err
	}
	d.say("  the payer address the server signs from: %s", strings.TrimSpace(payer))
	// What this step prints is read from the answers: which 402 was
	// signed, to whom, for what, and why the other was not.
	var paid demoPaid
	if err := d.call(ctx, "authorize_payment", map[string]any{"payment_required": demoPaymentRequired("https://reports.example.com/monthly", demoSellerSettles, "250000")}, &paid); err != nil {
		return err
	}
	if paid.Decision != "allow" || paid.Payment == nil || paid.Authorization == nil || paid.Reservation == nil {
		return fmt.Errorf("expected a signed payment for the settled seller, got %q", paid.Decision)
	}
	au := paid.Authorization
	d.say("  the 402 of %s: %s to %s for %s", paid.Accepted.Host, demoAmount(paid.Accepted.Atomic, paid.Accepted.Asset), paid.Accepted.PayTo, paid.Reservation.Resource)
	d.say("  decision: ALLOW — signed an EIP-3009 authorization from %s to %s for exactly %s, valid until %s",
		au.Payer, au.PayTo, demoAmount(au.Value, paid.Accepted.Asset), time.Unix(au.ValidBefore, 0).UTC().Format(time.RFC3339))
	d.say("  send it as the %s header (%d bytes of base64); nonce %s, derived from receipt %s",
		paid.Payment.HeaderName, len(paid.Payment.Header), au.Nonce, paid.ReceiptID)
	nonce := au.Nonce
	var other demoPaid
	if err := d.call(ctx, "authorize_payment", map[string]any{"payment_required": demoPaymentRequired("https://quotes.example.net/live", demoSellerSilent, "400000")}, &other); err != nil {
		return err
	}
	if other.Decision == "allow" || other.Payment != nil || other.Authorization != nil {
		return fmt.Errorf("expected no signature for the silent seller, got %q", other.Decision)
	}
	d.say("  the 402 of %s: %s to %s — %s, nothing is signed", other.Accepted.Host, demoAmount(other.Accepted.Atomic, other.Accepted.Asset), other.Accepted.PayTo, strings.ToUpper(other.Decision))
	switch {
	case other.ReviewID == "":
	case other.ReviewID == rejected:
		d.say("  review_id: %s, the review rejected above", other.ReviewID)
	default:
		d.say("  review_id: %s, a new review: the one rejected above (%s) decided a question that named no resource, and a decision binds to its terms", other.ReviewID, rejected)
	}
	for _, r := range other.Reasons {
		d.say("  - %s: %s", r.Rule, r.Detail)
	}
	d.say("  the proof of the one signed payment, checked against the signed receipts:")
	if _, err := d.cli(ctx, "authorization", "show", nonce, "--dir", d.root); err != nil {
		return err
	}

	d.heading("Anyone can check the log against the signatures, and verify each chain offline")
	out, err := d.cli(ctx, "audit", "--dir", d.root, "--reviewers", d.reviewers)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(out, "CONSISTENT") {
		return errors.New("the audit found the log and the chains disagree")
	}
	lines, err := d.cli(ctx, "chain", "list", "--dir", d.root)
	if err != nil {
		return err
	}
	keyring := filepath.Join(d.root, "guard", "keyring.json")
	for _, line := range strings.Split(strings.TrimSpace(lines), "\n") {
		fields := strings.Split(line, "\t")
		if len(fields) != 5 {
			return fmt.Errorf("chain list printed %q", lines)
		}
		out, err := d.cli(ctx, "verify", fields[1], "--keyring", keyring)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(out, "VALID") {
			return errors.New("a decision chain did not verify")
		}
	}
	d.heading("The seller settles; the payment's dossier, verified offline")
	// The demo's seller is simulated: its settlement answer is the shape
	// @x402/core's PAYMENT-RESPONSE has, with a made-up transaction hash.
	var settled struct {
		ReceiptID string   `json:"receipt_id"`
		Findings  []string `json:"findings"`
	}
	tx := "0x" + strings.Repeat("d0551e", 10) + "d055"
	if err := d.call(ctx, "record_receipt", map[string]any{"nonce": nonce, "payment_response": map[string]any{
		"success": true, "transaction": tx, "network": "eip155:8453", "payer": au.Payer}}, &settled); err != nil {
		return err
	}
	d.say("  record_receipt: the seller's settlement (transaction %s, simulated here) is recorded as receipt %s; the hold no longer counts as an open payment", tx, settled.ReceiptID)
	dossier := filepath.Join(filepath.Dir(d.root), "dossier.json")
	if _, err := d.cli(ctx, "dossier", "export", nonce, "--dir", d.root, "--key-file", d.key, "--out", dossier); err != nil {
		return err
	}
	out, err = d.cli(ctx, "dossier", "verify", dossier, "--keyring", keyring, "--reviewers", d.reviewers)
	if err != nil {
		return err
	}
	if !strings.Contains(out, "VALID: ") {
		return errors.New("the dossier did not verify")
	}
	d.say("\nDemo complete: review → rejected by a human with a key of their own → the rejection holds → a payment signed only on allow → audit CONSISTENT → chains VALID → the payment's dossier VALID.")
	return nil
}

// call invokes a tool and decodes its structured result into v.
func (d *demo) call(ctx context.Context, tool string, args map[string]any, v any) error {
	req := mcp.CallToolRequest{}
	req.Params.Name = tool
	req.Params.Arguments = args
	res, err := d.client.CallTool(ctx, req)
	if err != nil {
		return fmt.Errorf("%s: %w", tool, err)
	}
	if res.IsError {
		var b strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(mcp.TextContent); ok {
				b.WriteString(tc.Text)
			}
		}
		return fmt.Errorf("%s answered an error: %s", tool, b.String())
	}
	data, err := json.Marshal(res.StructuredContent)
	if err != nil {
		return fmt.Errorf("%s: %w", tool, err)
	}
	return json.Unmarshal(data, v)
}

// cli runs this program's own command line, as an operator would, and
// prints the exact command (every flag) and its output, so a reader can
// repeat it.
func (d *demo) cli(ctx context.Context, args ...string) (string, error) {
	d.say("  $ haia-trace-mcp %s", shellJoin(args))
	cmd := exec.CommandContext(ctx, d.self, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("haia-trace-mcp %s: %v: %s", shellJoin(args), err, strings.TrimSpace(errb.String()))
	}
	if s := strings.TrimSpace(out.String()); s != "" {
		d.say("%s", indent(s))
	}
	return out.String(), nil
}

// shellJoin writes arguments the way a POSIX shell would read them back.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a != "" && !strings.ContainsAny(a, " \t\n'\"\\$`;&|<>()*?[]#~!{}") {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = "    " + l
	}
	return strings.Join(lines, "\n")
}

// writeDemoPayerKey makes the demo's payer key: a fresh secp256k1 key,
// 64 hex digits in a 0600 file (it pays nothing: the money is simulated).
func writeDemoPayerKey(path string) error {
	for {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		text := hex.EncodeToString(b)
		if _, err := x402.ParseKey([]byte(text), nil); err != nil {
			continue // not a valid scalar: draw again (p ≈ 2^-128)
		}
		return os.WriteFile(path, []byte(text+"\n"), 0o600)
	}
}

// demoPaid is what the demo reads from an authorize_payment answer.
type demoPaid struct {
	Decision  string `json:"decision"`
	ReceiptID string `json:"receipt_id"`
	ReviewID  string `json:"review_id"`
	Reasons   []struct {
		Rule   string `json:"rule"`
		Detail string `json:"detail"`
	} `json:"reasons"`
	Accepted struct {
		Asset  string `json:"asset"`
		Atomic string `json:"amount_atomic"`
		PayTo  string `json:"pay_to"`
		Host   string `json:"host"`
	} `json:"accepted"`
	Reservation *struct {
		Resource string `json:"resource"`
	} `json:"reservation"`
	Payment *struct {
		HeaderName string `json:"header_name"`
		Header     string `json:"header"`
	} `json:"payment"`
	Authorization *struct {
		Payer       string `json:"payer"`
		PayTo       string `json:"pay_to"`
		Value       string `json:"value"`
		ValidBefore int64  `json:"valid_before"`
		Nonce       string `json:"nonce"`
	} `json:"authorization"`
}

// demoAmount writes atomic units of an asset as the rest of the command
// line does, "0.25 USDC", by the policy the demo's server runs with (the
// defaults); an asset it does not know stays in atomic units.
func demoAmount(atomic, asset string) string {
	n, ok := new(big.Int).SetString(atomic, 10)
	if !ok {
		return atomic + " atomic units of " + asset
	}
	return amountText(n, asset, guard.DefaultConfig().Assets)
}

// demoPaymentRequired is a seller's x402 v2 402 answer for amount atomic
// USDC on Base to payTo, for the resource url.
func demoPaymentRequired(url, payTo, amount string) map[string]any {
	return map[string]any{"x402Version": 2, "resource": map[string]any{"url": url},
		"accepts": []any{map[string]any{"scheme": "exact", "network": "eip155:8453", "amount": amount,
			"asset": simrec.USDCBase, "payTo": payTo, "maxTimeoutSeconds": 120,
			"extra": map[string]any{"name": "USD Coin", "version": "2"}}}}
}
