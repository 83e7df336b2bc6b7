package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jcs"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment"
)

// maxArgBytes bounds a paying call's arguments.
const maxArgBytes = 256 << 10

// ArgError says why a paying call's arguments cannot be read exactly; the
// call is refused and nothing is forwarded. Its message is for the caller.
type ArgError struct{ Msg string }

func (e *ArgError) Error() string { return e.Msg }

func argErrorf(format string, a ...any) error { return &ArgError{Msg: fmt.Sprintf(format, a...)} }

// read turns a paying call's raw arguments into the engine's question and
// the exact bytes to forward. It reads the raw JSON text, so that nothing a
// decoder would quietly drop reaches the upstream unread: duplicate keys,
// numbers that are not integers, integers beyond 2^53, keys that are not
// printable ASCII (look-alikes, invisible characters), keys the input
// schema does not declare, and copies of a mapped name inside free-form
// objects are all refused. What is forwarded is the JCS form of what was
// read, and that is what the receipt's paramsHash covers.
func (r *resolved) read(raw []byte, pol *guard.Config, now time.Time) (engine.Question, []byte, error) {
	if len(raw) == 0 || string(raw) == "null" {
		raw = []byte("{}")
	}
	if len(raw) > maxArgBytes {
		return engine.Question{}, nil, argErrorf("the arguments of %s are %d bytes; a paying call's arguments are at most %d", r.tool, len(raw), maxArgBytes)
	}
	v, err := jcs.Parse(raw)
	if err != nil {
		return engine.Question{}, nil, argErrorf("the arguments of paying tool %s cannot be read exactly (%s); nothing was forwarded. A paying call takes strict JSON: no duplicate keys, no fractions or exponents anywhere (send amounts as decimal strings)",
			r.tool, strings.TrimPrefix(err.Error(), "jcs: "))
	}
	args, ok := v.(map[string]any)
	if !ok {
		return engine.Question{}, nil, argErrorf("the arguments of %s must be a JSON object", r.tool)
	}
	if err := r.checkKeys(args, r.schema, nil, false); err != nil {
		return engine.Question{}, nil, err
	}
	if r.m.PaymentRequired.Path != nil {
		q, err := r.read402(args, pol, now)
		if err != nil {
			return engine.Question{}, nil, err
		}
		canon, err := jcs.Marshal(args)
		if err != nil {
			return engine.Question{}, nil, argErrorf("the arguments of %s cannot be put in canonical form: %s", r.tool, strings.TrimPrefix(err.Error(), "jcs: "))
		}
		return q, canon, nil
	}
	var q engine.Question
	// A call that passes no 402 carries no signed offer: where the policy
	// requires one from its counterparty (requireSignedOffers), it is
	// review, as a 402 without offers is for authorize_payment.
	q.Offer = &guard.OfferEvidence{}
	cp, err := r.str(args, r.m.Counterparty, "counterparty")
	if err != nil {
		return engine.Question{}, nil, err
	}
	q.Counterparty = cp
	if !r.m.Asset.IsZero() {
		if q.Asset, err = r.str(args, r.m.Asset, "asset"); err != nil {
			return engine.Question{}, nil, err
		}
	}
	if q.Amount, err = r.amount(args, q.Asset, pol); err != nil {
		return engine.Question{}, nil, err
	}
	if err := r.seller(args, &q); err != nil {
		return engine.Question{}, nil, err
	}
	canon, err := jcs.Marshal(args)
	if err != nil {
		return engine.Question{}, nil, argErrorf("the arguments of %s cannot be put in canonical form: %s", r.tool, strings.TrimPrefix(err.Error(), "jcs: "))
	}
	return q, canon, nil
}

// read402 reads the payment of a tool that passes the seller's 402 from
// the 402 itself, with the reader authorize_payment uses (payment.ReadPaid):
// the entry, the seller's host beside its payTo, and the seller's signed
// offer for the entry, checked before the engine is asked.
func (r *resolved) read402(args map[string]any, pol *guard.Config, now time.Time) (engine.Question, error) {
	p := strings.Join(r.m.PaymentRequired.Path, ".")
	v, ok := lookup(args, r.m.PaymentRequired.Path)
	if !ok || v == nil {
		return engine.Question{}, argErrorf("paying tool %s: the seller's 402 (argument %q) is missing; nothing was forwarded", r.tool, p)
	}
	var pr any
	switch x := v.(type) {
	case string:
		pr = x
	case map[string]any:
		b, err := jcs.Marshal(x)
		if err != nil {
			return engine.Question{}, argErrorf("paying tool %s: the seller's 402 (argument %q) cannot be put in canonical form: %s; nothing was forwarded", r.tool, p, strings.TrimPrefix(err.Error(), "jcs: "))
		}
		pr = json.RawMessage(b)
	default:
		return engine.Question{}, argErrorf("paying tool %s: the seller's 402 (argument %q) must be the PaymentRequired object or the base64 value of its PAYMENT-REQUIRED header; nothing was forwarded", r.tool, p)
	}
	// The resource is optional beside a 402, as it is for
	// authorize_payment: without it, the 402's declaration is judged.
	resource := ""
	if v, ok := lookup(args, r.m.Resource.Path); r.m.Resource.HasValue || r.m.Resource.Path != nil && ok && v != nil {
		var err error
		if resource, err = r.str(args, r.m.Resource, "resource"); err != nil {
			return engine.Question{}, err
		}
	}
	rd, err := payment.ReadPaid(pr, resource, pol, now)
	if err != nil {
		var refused *payment.RefusedError
		if errors.As(err, &refused) {
			return engine.Question{}, argErrorf("paying tool %s: the seller's 402 (argument %q): %s", r.tool, p, strings.Replace(refused.Message, "nothing was asked or signed", "nothing was forwarded", 1))
		}
		return engine.Question{}, err
	}
	return rd.Question, nil
}

// seller reads the mapped payTo and resource into the question. A payee
// address beside a resource is judged with the resource's host, as
// check_before_pay judges a host with its pay_to: lists, limits and open
// payments then bind the seller whatever address it names.
func (r *resolved) seller(args map[string]any, q *engine.Question) error {
	var err error
	if !r.m.Resource.IsZero() {
		if q.Resource, err = r.str(args, r.m.Resource, "resource"); err != nil {
			return err
		}
	}
	if !r.m.PayTo.IsZero() {
		if q.PayTo, err = r.str(args, r.m.PayTo, "pay_to"); err != nil {
			return err
		}
	}
	if q.Resource == "" || q.PayTo != "" {
		return nil
	}
	cp, err := guard.ParseCounterparty(q.Counterparty)
	if err != nil || cp.Kind != guard.KindAddress {
		return nil // a host or URL counterparty: the engine reads it
	}
	host, err := guard.ParseCounterparty(q.Resource)
	if err != nil || host.Kind != guard.KindHost {
		return argErrorf("paying tool %s: the resource (%s) names no host to judge beside the payee %s; nothing was forwarded", r.tool, r.m.Resource, cp.Value)
	}
	q.Counterparty, q.PayTo = host.Value, cp.Value
	return nil
}

// checkKeys walks the arguments beside the schema. Where the schema
// declares properties, only declared keys are accepted; where it declares
// none (a free-form object), a key named like a mapped field is refused as a
// copy that could carry the money elsewhere. Every key is printable ASCII.
func (r *resolved) checkKeys(v any, schema schemaNode, path []string, free bool) error {
	switch x := v.(type) {
	case map[string]any:
		props := schema.properties()
		for k, child := range x {
			at := strings.Join(append(append([]string{}, path...), k), ".")
			if !asciiKey(k) {
				return argErrorf("argument %q of %s is not a plain ASCII name (a look-alike or invisible character?); a paying call's argument names are read byte for byte, so nothing was forwarded", at, r.tool)
			}
			if !free && props != nil {
				if mapped := r.caseTwin(path, k); mapped != "" {
					return argErrorf("argument %q of paying tool %s is the mapped argument %q spelled in another case; a reader that ignores case (the upstream's, perhaps) could take one for the other, so nothing was forwarded", at, r.tool, mapped)
				}
				sub, ok := props[k]
				if !ok {
					return argErrorf("argument %q is not in the input schema of paying tool %s; a paying call carries only the arguments its schema declares, so nothing was forwarded", at, r.tool)
				}
				if pr := r.m.PaymentRequired.Path; pr != nil && len(pr) == len(path)+1 && slices.Equal(pr[:len(path)], path) && pr[len(path)] == k {
					// The seller's 402 is read by the 402 reader, as
					// strictly as authorize_payment reads it.
					continue
				}
				if err := r.checkKeys(child, schemaNode{v: sub}, append(append([]string{}, path...), k), false); err != nil {
					return err
				}
				continue
			}
			for _, leaf := range r.leaves {
				if strings.EqualFold(k, leaf) {
					return argErrorf("argument %q of paying tool %s repeats the mapped name %q inside an object the schema does not describe; a second copy of a payment field is refused, so nothing was forwarded", at, r.tool, leaf)
				}
			}
			if err := r.checkKeys(child, schemaNode{}, append(append([]string{}, path...), k), true); err != nil {
				return err
			}
		}
	case []any:
		var items schemaNode
		if m := schema.obj(); m != nil && !free {
			items = schemaNode{v: m["items"]}
		}
		for i, it := range x {
			if err := r.checkKeys(it, items, append(append([]string{}, path...), fmt.Sprint(i)), free || items.obj() == nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// caseTwin returns the mapped path (dotted) of which key k at path is a
// sibling spelled in another letter case, or "".
func (r *resolved) caseTwin(path []string, k string) string {
	for _, p := range r.paths {
		leaf := p[len(p)-1]
		if len(p) == len(path)+1 && slices.Equal(p[:len(path)], path) && k != leaf && strings.EqualFold(k, leaf) {
			return strings.Join(p, ".")
		}
	}
	return ""
}

// lookup follows a path through the arguments.
func lookup(args map[string]any, path []string) (any, bool) {
	var cur any = args
	for _, seg := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[seg]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func (r *resolved) str(args map[string]any, f Field, name string) (string, error) {
	if f.HasValue {
		return f.Value, nil
	}
	p := strings.Join(f.Path, ".")
	v, ok := lookup(args, f.Path)
	if !ok || v == nil {
		return "", argErrorf("paying tool %s: the %s (argument %q) is missing; nothing was forwarded", r.tool, name, p)
	}
	s, ok := v.(string)
	if !ok || s == "" {
		return "", argErrorf("paying tool %s: the %s (argument %q) must be a non-empty string; nothing was forwarded", r.tool, name, p)
	}
	if err := r.guardCheck(name, p, s); err != nil {
		return "", err
	}
	return s, nil
}

// guardCheck holds a mapped argument to the guard's own checks of the
// question's argument called name (guard.Arg), as check_before_pay does.
func (r *resolved) guardCheck(name, path, text string) error {
	arg, ok := guard.QuestionArg(name)
	if !ok {
		return fmt.Errorf("proxy: %s is not an argument of a guard question", name)
	}
	if msg := arg.Check(text, true); msg != "" {
		return argErrorf("paying tool %s: argument %q: %s; nothing was forwarded", r.tool, path, msg)
	}
	return nil
}

// amount reads the mapped amount as the engine's display decimal.
func (r *resolved) amount(args map[string]any, asset string, pol *guard.Config) (string, error) {
	p := strings.Join(r.m.Amount.Path, ".")
	v, ok := lookup(args, r.m.Amount.Path)
	if !ok || v == nil {
		return "", argErrorf("paying tool %s: the amount (argument %q) is missing; nothing was forwarded", r.tool, p)
	}
	if r.m.AmountUnit == UnitDisplay {
		s, ok := v.(string)
		if !ok {
			return "", argErrorf("paying tool %s: the amount (argument %q) must be a decimal string such as \"1.50\"; a JSON number is refused (it may be read as a float), so nothing was forwarded", r.tool, p)
		}
		if err := r.guardCheck("amount", p, s); err != nil {
			return "", err
		}
		if err := guard.CheckAmountSyntax(s); err != nil {
			return "", argErrorf("paying tool %s: the amount (argument %q) %q is not a plain decimal; nothing was forwarded", r.tool, p, s)
		}
		return s, nil
	}
	var digits string
	switch n := v.(type) {
	case string:
		digits = n
	case int64:
		if n < 0 {
			return "", argErrorf("paying tool %s: the amount (argument %q) is negative; nothing was forwarded", r.tool, p)
		}
		digits = fmt.Sprint(n)
	default:
		return "", argErrorf("paying tool %s: the amount (argument %q) must be an integer count of the asset's smallest unit; nothing was forwarded", r.tool, p)
	}
	if !atomicDigits(digits) {
		return "", argErrorf("paying tool %s: the amount (argument %q) %q is not an integer count of the asset's smallest unit (digits only, no sign, no leading zeros); nothing was forwarded", r.tool, p, digits)
	}
	a, err := pol.Assets.Resolve(asset, pol.DefaultAsset)
	if err != nil {
		return "", argErrorf("paying tool %s: the asset %q is not one the policy knows, so an atomic amount cannot be read (%s); nothing was forwarded", r.tool, asset, err)
	}
	atomic, _ := new(big.Int).SetString(digits, 10)
	return guard.FormatAmount(atomic, a.Decimals), nil
}

func atomicDigits(s string) bool {
	if s == "" || len(s) > 78 || (len(s) > 1 && s[0] == '0') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
