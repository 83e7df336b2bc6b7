package payment

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/strictjson"
)

// The recorder's events that carry a seller's settlement answer: the
// buyer's client sees it in the paid response (x402.payment.responded), the
// seller and its facilitator write their own settle (x402.settle.ok). Only
// a settle whose success is the JSON true is one.
var traceSettleEvents = map[string]bool{"x402.payment.responded": true, "x402.settle.ok": true}

// maxTraceEventLine bounds one event line read for settlements; a longer
// line is passed over (the receipt reader holds it to the same bound).
const maxTraceEventLine = 1 << 20

var traceNonceRE = regexp.MustCompile(`^0x[0-9a-fA-F]{64}$`)

// traceSettlement is one successful settlement event of the Trace, as read.
type traceSettlement struct {
	Run, Operation, Event, Role, OccurredAt string
	At                                      time.Time
	Line                                    int
	// The requirements the event names (the x402 entry paid) and the
	// resource it was paid for.
	PayTo, Amount, Asset, Network, Resource string
	// Settle is the event's settle object, as written.
	Settle json.RawMessage
}

// traceRun is what one run file says about settlements: its settlement
// events, and per operation the EIP-3009 nonces its events carry (a member
// named "nonce" anywhere in a payload, 0x and 64 hex digits: where a
// recorder writes the payment payload it sent).
type traceRun struct {
	Settlements []traceSettlement
	Nonces      map[string][]string
	// Skipped counts lines that could not be read exactly (not JSON, a
	// member twice, too long): none of them binds anything.
	Skipped int
	// Sum is an FNV-1a hash of what can bind (each settlement's line,
	// operation and settle, each operation's nonces, in file order): a
	// run whose Sum is unchanged binds nothing new.
	Sum uint64
}

// readTraceRun reads one run file. Nothing in it is trusted: a line is read
// only when every object in it names each member once, and members are
// looked up by their exact names, so no reader could take another value
// than this one does.
func readTraceRun(r io.Reader, run string) (traceRun, error) {
	out := traceRun{Nonces: map[string][]string{}}
	br := bufio.NewReaderSize(r, 64<<10)
	for n := 1; ; n++ {
		line, tooLong, err := readEventLine(br)
		if len(line) > 0 || tooLong {
			if tooLong || !readTraceLine(line, run, n, &out) {
				out.Skipped++
			}
		}
		if err == io.EOF {
			out.Sum = out.sum()
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("run %s, line %d: %w", run, n, err)
		}
	}
}

// readEventLine reads one line of at most maxTraceEventLine bytes; a longer
// one is consumed and reported, not returned.
func readEventLine(br *bufio.Reader) ([]byte, bool, error) {
	var buf []byte
	tooLong := false
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(chunk) > maxTraceEventLine+1 {
				tooLong, buf = true, nil
			} else {
				buf = append(buf, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimSpace(buf), tooLong, err
	}
}

func readTraceLine(line []byte, run string, n int, out *traceRun) bool {
	var shape map[string]any
	if err := strictjson.Check(line, &shape); err != nil {
		return false
	}
	var ev map[string]json.RawMessage
	if json.Unmarshal(line, &ev) != nil || ev == nil {
		return false
	}
	typ, op := rawString(ev["event_type"]), rawString(ev["context_id"])
	var payload map[string]json.RawMessage
	if json.Unmarshal(ev["payload"], &payload) != nil || payload == nil {
		return false
	}
	if op != "" && bytes.Contains(line, []byte(`"nonce"`)) {
		var p any
		if json.Unmarshal(ev["payload"], &p) == nil {
			collectNonces(p, 0, func(nonce string) {
				for _, have := range out.Nonces[op] {
					if have == nonce {
						return
					}
				}
				out.Nonces[op] = append(out.Nonces[op], nonce)
			})
		}
	}
	if !traceSettleEvents[typ] || op == "" {
		return true
	}
	var settle map[string]json.RawMessage
	if json.Unmarshal(payload["settle"], &settle) != nil || string(settle["success"]) != "true" {
		return true
	}
	var req, res map[string]json.RawMessage
	_ = json.Unmarshal(payload["requirements"], &req)
	_ = json.Unmarshal(payload["resource"], &res)
	resource := rawString(res["url"])
	if resource == "" {
		resource = rawString(payload["resource"])
	}
	s := traceSettlement{Run: run, Operation: op, Event: typ, Role: rawString(ev["role"]), OccurredAt: rawString(ev["occurred_at"]), Line: n,
		PayTo: rawString(req["pay_to"]), Amount: rawString(req["amount"]), Asset: rawString(req["asset"]), Network: rawString(req["network"]),
		Resource: resource, Settle: append(json.RawMessage(nil), payload["settle"]...)}
	at, err := time.Parse(time.RFC3339Nano, s.OccurredAt)
	if err != nil {
		return false
	}
	s.At = at
	out.Settlements = append(out.Settlements, s)
	return true
}

// collectNonces calls found with every string member named "nonce" that is
// a 32-byte hex value, lower-cased.
func collectNonces(v any, depth int, found func(string)) {
	if depth > strictjson.MaxDepth {
		return
	}
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && k == "nonce" && traceNonceRE.MatchString(s) {
				found(strings.ToLower(s))
				continue
			}
			collectNonces(e, depth+1, found)
		}
	case []any:
		for _, e := range x {
			collectNonces(e, depth+1, found)
		}
	}
}

// rawString is a JSON string's value, or "" for anything else.
func rawString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// sum hashes what can bind (see Sum).
func (r traceRun) sum() uint64 {
	h := fnv.New64a()
	for _, s := range r.Settlements {
		fmt.Fprintf(h, "s\x00%d\x00%s\x00%s\x00", s.Line, s.Operation, s.Settle)
	}
	ops := make([]string, 0, len(r.Nonces))
	for op := range r.Nonces {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	for _, op := range ops {
		fmt.Fprintf(h, "n\x00%s\x00%s\x00", op, strings.Join(r.Nonces[op], ","))
	}
	return h.Sum64()
}
