package proxy

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
)

// The upstream's answers the proxy decides on are read exactly: a member
// named twice anywhere, or a member the proxy reads spelled in another
// case, is refused with where; members it does not read are allowed.
func TestAnswersReadExactly(t *testing.T) {
	for _, c := range []struct {
		name, method, answer, want string
	}{
		{"a result", "tools/call", `{"content":[{"type":"text","text":"ok"}],"isError":false,"extra":{"a":1}}`, ""},
		{"a task created", "tools/call", `{"task":{"taskId":"t1","status":"working","createdAt":"2026-01-01T00:00:00Z","ttl":60000,"future":1}}`, ""},
		{"a task's result", "tasks/result", `{"content":[],"structuredContent":{"Status":"a","status":"b"}}`, ""},
		{"a task's status", "tasks/get", `{"taskId":"t1","status":"failed"}`, ""},
		{"a tools/list page", "tools/list", `{"tools":[{"name":"a","inputSchema":{"type":"object"},"annotations":{"title":"A"}}],"nextCursor":"x"}`, ""},
		{"a method not decided on", "prompts/get", `{"messages":[],"messages":[]}`, ""},

		{"isError twice", "tools/call", `{"content":[],"isError":true,"isError":false}`, `the field "isError" appears twice`},
		{"IsError beside isError", "tools/call", `{"content":[],"isError":false,"IsError":true}`, `IsError: "IsError" is "isError" in another case`},
		{"ISERROR alone", "tasks/result", `{"content":[],"ISERROR":true}`, `"ISERROR" is "isError" in another case`},
		{"a member twice in content", "tools/call", `{"content":[{"type":"text","text":"a","text":"b"}]}`, `content[0]: the field "text" appears twice`},
		{"a member twice, one escaped", "tools/call", `{"content":[],"isError":false,"\u0069sError":true}`, `the field "isError" appears twice`},
		{"Task beside task", "tools/call", `{"Task":null,"task":{"taskId":"t1","status":"working"}}`, `"Task" is "task" in another case`},
		{"a task's Status", "tools/call", `{"task":{"taskId":"t1","status":"working","Status":"completed"}}`, `task.Status: "Status" is "status" in another case`},
		{"a task's status twice", "tasks/get", `{"taskId":"t1","status":"failed","status":"completed"}`, `the field "status" appears twice`},
		{"a task's Status beside status", "tasks/get", `{"taskId":"t1","status":"failed","Status":"completed"}`, `"Status" is "status" in another case`},
		{"a tool's Name", "tools/list", `{"tools":[{"name":"a","inputSchema":{}},{"name":"b","Name":"c","inputSchema":{}}]}`, `tools[1].Name: "Name" is "name" in another case`},
		{"a schema property twice", "tools/list", `{"tools":[{"name":"a","inputSchema":{"properties":{"to":{},"to":{}}}}]}`, `the field "to" appears twice`},
		{"NextCursor beside nextCursor", "tools/list", `{"tools":[],"nextCursor":"","NextCursor":"x"}`, `"NextCursor" is "nextCursor" in another case`},
		{"a resource page's member twice", "resources/list", `{"resources":[{"uri":"a","uri":"b"}]}`, `the field "uri" appears twice`},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := &transport.JSONRPCResponse{Result: json.RawMessage(c.answer)}
			got, err := exactAnswer(c.method, res, nil)
			if c.want == "" {
				if err != nil || got != res {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ne *NotExactError
			if !errors.As(err, &ne) || ne.Method != c.method || !strings.Contains(err.Error(), c.want) || got != nil {
				t.Fatalf("want a refusal naming %q, got %v", c.want, err)
			}
		})
	}
	// An error answer, or a failure on the way, passes as it is.
	e := &transport.JSONRPCResponse{Error: &mcp.JSONRPCErrorDetails{Code: -32602, Message: "x"}}
	if got, err := exactAnswer("tools/call", e, nil); got != e || err != nil {
		t.Fatalf("%v %v", got, err)
	}
	boom := errors.New("boom")
	if _, err := exactAnswer("tools/call", nil, boom); err != boom {
		t.Fatalf("%v", err)
	}
}

// FuzzExactAnswer: an upstream's answer is its own bytes; reading it never
// panics, and an answer accepted has no member twice and none of those the
// proxy reads in another case.
func FuzzExactAnswer(f *testing.F) {
	for _, s := range []string{
		`{"content":[],"isError":false}`, `{"content":[],"isError":false,"IsError":true}`,
		`{"task":{"taskId":"t","status":"working","Status":"x"}}`, `{"tools":[{"name":"a","Name":"b"}]}`,
		`{"taskId":"t","status":"failed"}`, `[]`, `{"a":{"b":1,"b":2}}`,
	} {
		f.Add(uint8(0), []byte(s))
	}
	methods := []string{"tools/call", "tasks/result", "tasks/get", "tools/list", "resources/list"}
	f.Fuzz(func(t *testing.T, m uint8, data []byte) {
		method := methods[int(m)%len(methods)]
		res, err := exactAnswer(method, &transport.JSONRPCResponse{Result: json.RawMessage(data)}, nil)
		if err != nil {
			return
		}
		if res == nil {
			t.Fatal("no answer and no error")
		}
		var top map[string]json.RawMessage
		if json.Unmarshal(data, &top) != nil {
			return
		}
		dec := json.NewDecoder(strings.NewReader(string(data)))
		if _, err := dec.Token(); err != nil {
			return
		}
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return
			}
			name := tok.(string)
			if seen[name] {
				t.Fatalf("accepted %q twice", name)
			}
			seen[name] = true
			for _, want := range answerShapes[method].names {
				if name != want && strings.EqualFold(name, want) {
					t.Fatalf("accepted %q beside %q", name, want)
				}
			}
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				t.Fatal(err)
			}
		}
	})
}
