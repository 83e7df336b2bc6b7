package payment

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/strictjson"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
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
	// run whose Sum is unchanged binds nothing new. Settlements left out
	// (see prune) count in it as read.
	Sum uint64
	// dropped marks (by a hash of the operation, 4,096 bits) the
	// operations whose settlements prune left out; reread says a nonce
	// then came for one of them, so the run must be read again whole.
	dropped [64]uint64
	reread  bool
}

// payerSet holds the lower-cased addresses a settlement of the Trace can
// be bound to by its terms: the payers of the authorizations this server
// signed, and its own.
type payerSet map[string]bool

// concerns says a settlement event may bind to an authorization of one of
// the payers in p by its terms: its settle names one of them (or a payer
// that is not plain ASCII, whose case folding is left to the binding).
func (p payerSet) concerns(s traceSettlement) bool {
	st, err := x402.ParseSettlement(s.Settle)
	if err != nil {
		return false // no transaction, no payer: binds by nonce only
	}
	for i := 0; i < len(st.Payer); i++ {
		if st.Payer[i] >= 0x80 {
			return true
		}
	}
	return p[strings.ToLower(st.Payer)]
}

func opBit(op string) (int, uint64) {
	h := mix(0, op)
	return int(h>>6) & 63, 1 << (h & 63)
}

// prune leaves out the settlements from index from on that no
// authorization of the payers can bind: those naming another payer, in an
// operation that carries no nonce (one that does binds by its nonce, of
// whichever payer the settle names). Such an operation is marked, so a
// nonce read for it later has the run read again whole. Keeping more than
// can bind is harmless: a settlement of another payer in an operation
// without a nonce binds to nothing.
func (r *traceRun) prune(from int, payers payerSet, more map[string][]string) {
	kept := r.Settlements[:from]
	for _, s := range r.Settlements[from:] {
		_, withNonce := r.Nonces[s.Operation]
		_, withMore := more[s.Operation]
		if withNonce || withMore || payers.concerns(s) {
			kept = append(kept, s)
			continue
		}
		w, b := opBit(s.Operation)
		r.dropped[w] |= b
	}
	clear(r.Settlements[len(kept):])
	if cap(kept) > 2*len(kept)+16 {
		// The array held the whole reading: keep only what is kept.
		kept = append([]traceSettlement(nil), kept...)
	}
	r.Settlements = kept
}

// readTraceRun reads one run file. Nothing in it is trusted: a line is read
// only when every object in it names each member once, and members are
// looked up by their exact names, so no reader could take another value
// than this one does.
func readTraceRun(r io.Reader, run string) (traceRun, error) {
	var c runCursor
	if err := c.readMore(r, run, nil); err != nil {
		return c.view, err
	}
	return c.view, nil
}

// runCursor is how far one run file was read: the whole lines up to off
// (what they say is run), and view, which is run with the file's last
// line when that line was not ended yet (a recorder writing it). A sweep
// reads only what was appended past off.
type runCursor struct {
	off   int64
	lines int
	// head and tail hash the first bytes of the file and the last before
	// off (runindex.HeadTail): the file still holds them when it was only
	// appended to, as the run index tells an append from a rewrite.
	head, tail [32]byte
	run        traceRun
	view       traceRun
}

// readMore reads r, which starts at c.off, to its end. With payers, the
// settlements read that no authorization of theirs can bind are not kept
// (prune), so what a cursor holds grows with this server's payments, not
// with the Trace.
func (c *runCursor) readMore(r io.Reader, run string, payers payerSet) error {
	if c.run.Nonces == nil {
		c.run.Nonces = map[string][]string{}
	}
	from := len(c.run.Settlements)
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, tooLong, n, err := readEventLine(br)
		if err == io.EOF {
			if payers != nil {
				// The unended line's nonces keep their operations'
				// settlements too: the view binds by them.
				var unended traceRun
				if len(line) > 0 && !tooLong {
					unended.Nonces = map[string][]string{}
					readTraceLine(line, run, c.lines+1, &unended)
				}
				c.run.prune(from, payers, unended.Nonces)
			}
			c.view = c.run
			if len(line) > 0 || tooLong {
				// Not ended: read into a copy, and read again once it is.
				c.view = c.run.clone()
				if tooLong || !readTraceLine(line, run, c.lines+1, &c.view) {
					c.view.Skipped++
				}
			}
			break
		}
		if err != nil {
			c.view = c.run
			return fmt.Errorf("run %s, line %d: %w", run, c.lines+1, err)
		}
		c.lines++
		c.off += int64(n)
		if len(line) > 0 || tooLong {
			if tooLong || !readTraceLine(line, run, c.lines, &c.run) {
				c.run.Skipped++
			}
		}
	}
	return nil
}

// clone copies what a later line may append to.
func (r traceRun) clone() traceRun {
	out := r
	out.Settlements = append([]traceSettlement(nil), r.Settlements...)
	out.Nonces = make(map[string][]string, len(r.Nonces))
	for k, v := range r.Nonces {
		out.Nonces[k] = append([]string(nil), v...)
	}
	return out
}

// readEventLine reads one line of at most maxTraceEventLine bytes; a longer
// one is consumed and reported, not returned. n is the bytes consumed; err
// is io.EOF when the line was not ended by a newline.
func readEventLine(br *bufio.Reader) ([]byte, bool, int, error) {
	var buf []byte
	tooLong := false
	n := 0
	for {
		chunk, err := br.ReadSlice('\n')
		n += len(chunk)
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
		return bytes.TrimSpace(buf), tooLong, n, err
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
				if len(out.Nonces[op]) == 0 {
					if w, b := opBit(op); out.dropped[w]&b != 0 {
						out.reread = true
					}
				}
				for _, have := range out.Nonces[op] {
					if have == nonce {
						return
					}
				}
				out.Nonces[op] = append(out.Nonces[op], nonce)
				out.Sum = mix(out.Sum, "n", op, nonce)
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
	out.Sum = mix(out.Sum, "s", strconv.Itoa(s.Line), s.Operation, string(s.Settle))
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

// mix adds parts to h, an FNV-1a hash of what can bind, in file order
// (see Sum): a run read further keeps hashing where it stopped.
func mix(h uint64, parts ...string) uint64 {
	const prime = 1099511628211
	if h == 0 {
		h = 14695981039346656037
	}
	for _, p := range parts {
		for i := 0; i < len(p); i++ {
			h ^= uint64(p[i])
			h *= prime
		}
		h ^= 0
		h *= prime
	}
	return h
}
