package engine

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// A decision's receipt signs only the keyed hash of its question
// (paramsHash): enough to prove which question was answered, not to ask it
// again. So that a candidate policy can be tried on history (Simulate),
// every answer keeps its question beside its receipt, in the decision's
// commit: the question exactly as hashed, what the hash does not cover
// (the seller's declared resource of an authorization, whether the
// template was named), and for a proxied call the call itself — sealed
// with the params key, so that a store writer who does not hold it can
// neither forge nor alter one, and bound to the receipt by its paramsHash.

// Kinds of kept question: which entry point asked.
const (
	QuestionCheck     = "check"     // check_before_pay
	QuestionAuthorize = "authorize" // authorize_payment (an x402 authorization)
	QuestionCall      = "call"      // a tool call the guard proxy forwards
)

// questionVersion is the kept question format this package writes.
const questionVersion = 1

// questionLabel domain-separates the seal from the key's other HMACs.
const questionLabel = "haia-trace-mcp/question/v1\x00"

// KeptQuestion is one decision's question as kept beside its receipt.
type KeptQuestion struct {
	V       int    `json:"v"`
	Receipt string `json:"receipt"`
	Kind    string `json:"kind"`
	Caller  string `json:"caller"`
	// Question and Resource are what the receipt's paramsHash covers
	// (QuestionHash) for a check or an authorization.
	Question guard.Question `json:"question"`
	Resource string         `json:"resource,omitempty"`
	// TemplateNamed: the caller named Question.Template (otherwise it is
	// the policy's question template of the time).
	TemplateNamed bool `json:"template_named,omitempty"`
	// SellerResource is the resource the seller's 402 declared
	// (authorize_payment), which duplicate_payment compares too.
	SellerResource string `json:"seller_resource,omitempty"`
	// Tool and Arguments (JCS) are a proxied call, what its paramsHash
	// covers (CallParamsHash); Question is then what the guard map read
	// from it.
	Tool      string          `json:"tool,omitempty"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	MAC       string          `json:"mac,omitempty"`
}

func questionSeal(key []byte, q KeptQuestion) (string, error) {
	q.MAC = ""
	b, err := json.Marshal(q)
	if err != nil {
		return "", err
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(questionLabel))
	m.Write(b)
	return hex.EncodeToString(m.Sum(nil)), nil
}

// keepQuestion writes the question of the decision of receipt r, in the
// decision's section, when the store keeps questions. A question too long
// to keep is logged and not kept: the decision stands, and a replay counts
// it among those without a question.
func (e *Engine) keepQuestion(ctx context.Context, w reviewlog.Writer, r noa.Receipt, kind, caller string, req guard.Request, q Question, call *Call) error {
	keeper, ok := w.(reviewlog.QuestionKeeper)
	if !ok {
		return nil
	}
	kq := KeptQuestion{V: questionVersion, Receipt: r.ID, Kind: kind, Caller: caller, Question: req.Question(), Resource: req.Resource,
		TemplateNamed: q.Template != "", SellerResource: req.SellerResource}
	if call != nil {
		kq.Tool, kq.Arguments = call.Tool, json.RawMessage(call.Arguments)
	}
	mac, err := questionSeal(e.cfg.ParamsKey, kq)
	if err != nil {
		return fmt.Errorf("keep the question: %w", err)
	}
	kq.MAC = mac
	line, err := json.Marshal(kq)
	if err != nil {
		return fmt.Errorf("keep the question: %w", err)
	}
	if len(line) > reviewlog.MaxQuestionLine {
		e.cfg.Logger.Warn("question not kept: too long to keep", "receipt_id", r.ID, "bytes", len(line))
		return nil
	}
	return keeper.KeepQuestion(ctx, r.ID, line)
}

// errQuestionSeal: a kept question not sealed by this server's params key.
var errQuestionSeal = errors.New("its seal does not verify under the server's params key (written or altered by someone who does not hold it)")

// readKept reads and unseals one kept question's line.
func readKept(key, line []byte) (KeptQuestion, error) {
	var kq KeptQuestion
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&kq); err != nil {
		return kq, fmt.Errorf("it is not a kept question: %w", err)
	}
	if kq.V != questionVersion {
		return kq, fmt.Errorf("it is of format %d, not %d", kq.V, questionVersion)
	}
	want, err := questionSeal(key, kq)
	if err != nil {
		return kq, err
	}
	if !hmac.Equal([]byte(want), []byte(kq.MAC)) {
		return kq, errQuestionSeal
	}
	return kq, nil
}

// paramsHash is the paramsHash the receipt of kq's decision must carry.
func (kq KeptQuestion) paramsHash(key []byte) (string, error) {
	if kq.Kind == QuestionCall {
		return CallParamsHash(key, Call{Tool: kq.Tool, Arguments: kq.Arguments})
	}
	return QuestionHash(key, kq.Question, kq.Resource)
}

// raw is the question as it is asked again.
func (kq KeptQuestion) raw() Question {
	q := Question{Counterparty: kq.Question.Counterparty, Amount: kq.Question.Amount, Asset: kq.Question.Asset,
		Resource: kq.Resource, PayTo: kq.Question.PayTo, SellerResource: kq.SellerResource}
	if kq.TemplateNamed {
		q.Template = kq.Question.Template
	}
	return q
}
