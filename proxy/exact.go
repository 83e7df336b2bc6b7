package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/client/transport"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/strictjson"
)

// The upstream's answers that the proxy decides on — a task call's answer,
// a task's result and status, the tools/list pages the guard map is checked
// against — are read as exactly as the review log: encoding/json matches
// member names without regard to case and keeps the last of two members of
// one name, so `{"status":"failed","Status":"completed"}` or a schema
// property named twice would say two things, one to the proxy and another
// to whoever else reads it. An answer with a member named twice in any
// object, or, in an object the proxy reads, a member spelled like one it
// reads in another case, is refused with where. Members the proxy does not
// read are allowed (protocol versions add them).

// shape is what the proxy reads of a JSON object: the member names, and the
// shapes of the members it reads further (an object, or each element of an
// array).
type shape struct {
	names   []string
	members map[string]*shape
	items   *shape
}

var (
	taskShape       = &shape{names: []string{"taskId", "status", "statusMessage", "createdAt", "lastUpdatedAt", "ttl", "pollInterval", "_meta"}}
	callResultNames = []string{"content", "structuredContent", "isError", "_meta", "resultType", "inputRequests", "requestState"}
	// callResultShape is a tools/call result, or a tasks/result answer.
	callResultShape = &shape{names: callResultNames}
	// taskCallShape is the answer to a task-augmented tools/call: a task
	// created, or the result of a call the upstream ran at once.
	taskCallShape = &shape{names: append([]string{"task"}, callResultNames...), members: map[string]*shape{"task": taskShape}}
	toolShape     = &shape{names: []string{"name", "title", "description", "inputSchema", "outputSchema", "annotations", "execution", "icons", "_meta"}}
)

// listShape is a page of a list method whose items are under key.
func listShape(key string) *shape {
	s := &shape{names: []string{key, "nextCursor", "_meta"}}
	if key == "tools" {
		s.members = map[string]*shape{key: {items: toolShape}}
	}
	return s
}

// readExactly checks raw against s (see above), then reads it into v.
func readExactly(raw []byte, s *shape, v any) error {
	if err := strictjson.Check(raw, new(any)); err != nil {
		return err
	}
	if err := s.check(raw, ""); err != nil {
		return err
	}
	if v == nil {
		return nil
	}
	return json.Unmarshal(raw, v)
}

// check refuses, in the object raw at path and the members s reads
// further, a member named like one of s's names in another case.
func (s *shape) check(raw json.RawMessage, path string) error {
	if s.items != nil {
		var list []json.RawMessage
		if json.Unmarshal(raw, &list) != nil {
			return nil // not an array: the reader's own error says so
		}
		for i, el := range list {
			if err := s.items.check(el, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return nil // not an object: the reader's own error says so
	}
	for name := range obj {
		for _, want := range s.names {
			if name != want && strings.EqualFold(name, want) {
				return &strictjson.Error{Path: strings.TrimPrefix(path+"."+name, "."), Msg: fmt.Sprintf("%q is %q in another case", name, want), Ambiguous: true}
			}
		}
	}
	for name, sub := range s.members {
		if v, ok := obj[name]; ok {
			if err := sub.check(v, strings.TrimPrefix(path+"."+name, ".")); err != nil {
				return err
			}
		}
	}
	return nil
}

// answerShapes are the answers the proxy decides on, by the method they
// answer.
var answerShapes = map[string]*shape{
	"tools/call":               taskCallShape,
	"tasks/result":             callResultShape,
	"tasks/get":                taskShape,
	"tools/list":               listShape("tools"),
	"resources/list":           listShape("resources"),
	"resources/templates/list": listShape("resourceTemplates"),
	"prompts/list":             listShape("prompts"),
}

// NotExactError is an upstream's answer refused because it cannot be read
// exactly: whether a call it answers was carried out is unknown.
type NotExactError struct {
	Method string
	Err    error
}

func (e *NotExactError) Error() string {
	return fmt.Sprintf("the upstream's answer to %s cannot be read exactly (%v)", e.Method, e.Err)
}

func (e *NotExactError) Unwrap() error { return e.Err }

// exactAnswer passes on a response to req, or refuses one the proxy decides
// on (answerShapes) that cannot be read exactly.
func exactAnswer(method string, res *transport.JSONRPCResponse, err error) (*transport.JSONRPCResponse, error) {
	s := answerShapes[method]
	if err != nil || res == nil || res.Error != nil || s == nil {
		return res, err
	}
	if err := readExactly(res.Result, s, nil); err != nil {
		return nil, &NotExactError{Method: method, Err: err}
	}
	return res, nil
}

// exactStdio and exactHTTP are the upstream's transports with exactAnswer
// on every response: the MCP client, and the proxy's own requests, read
// only answers that say one thing. Embedding the transport keeps every
// interface the client looks for (server requests, connection loss, HTTP).
type exactStdio struct{ *transport.Stdio }

func (t exactStdio) SendRequest(ctx context.Context, req transport.JSONRPCRequest) (*transport.JSONRPCResponse, error) {
	res, err := t.Stdio.SendRequest(ctx, req)
	return exactAnswer(req.Method, res, err)
}

type exactHTTP struct{ *transport.StreamableHTTP }

func (t exactHTTP) SendRequest(ctx context.Context, req transport.JSONRPCRequest) (*transport.JSONRPCResponse, error) {
	res, err := t.StreamableHTTP.SendRequest(ctx, req)
	return exactAnswer(req.Method, res, err)
}
