package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/mark3labs/mcp-go/mcp"
)

// payArgs is the input schema of the tools below: a payee and an amount.
const payArgs = `"to":{"type":"string"},"amount":{"type":"string"}`

// addFailing adds the tools that pay and then fail, each in its own way,
// and the ones an SDK refuses before their handler runs.
func (u *upstream) addFailing() {
	add := func(name, desc, extra string, h func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error)) {
		u.srv.AddTool(mcp.NewToolWithRawSchema(name, desc, json.RawMessage(
			`{"type":"object","properties":{`+payArgs+extra+`},"required":["to","amount"]}`)), h)
	}
	// pay_then_internal pays, then its handler returns an error: mcp-go
	// answers JSON-RPC -32603 (internal error).
	add("pay_then_internal", "Send USDC, then fail with an internal error.", "", func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if err := u.record("pay_then_internal", rawArgs(req)); err != nil {
			return nil, err
		}
		return nil, errors.New("the receipt service failed after the transfer")
	})
	// pay_then_panic pays, then its handler throws (panics): recovered,
	// it is answered -32603 "panic recovered in … tool handler".
	add("pay_then_panic", "Send USDC, then throw.", "", func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if err := u.record("pay_then_panic", rawArgs(req)); err != nil {
			return nil, err
		}
		panic("the wallet's reply could not be built after the transfer")
	})
	// pay_then_drop pays, then the server exits before it answers: the
	// connection drops with the call in flight.
	add("pay_then_drop", "Send USDC, then drop the connection.", "", func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if err := u.record("pay_then_drop", rawArgs(req)); err != nil {
			return nil, err
		}
		os.Exit(5)
		return nil, nil
	})
	// pay_then_code pays, then answers a JSON-RPC error with the code its
	// arguments name (a server-defined -32000, an application code, 0 as
	// the official Go SDK answers an error thrown by a raw tool handler).
	// Over stdio the layer in front of the server answers it (mcp-go's
	// handlers cannot choose a code); over HTTP its handler answers
	// -32603.
	add("pay_then_code", "Send USDC, then answer a JSON-RPC error of the given code.", `,"code":{"type":"integer"}`, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if err := u.record("pay_then_code", rawArgs(req)); err != nil {
			return nil, err
		}
		return nil, errors.New("the payment network answered after the transfer")
	})
	// strict_send pays, but only for a memo of at most 8 characters: a
	// longer one is refused before the handler runs, as an SDK that
	// validates arguments against the input schema refuses it (-32602).
	add("strict_send", "Send USDC with a short memo.", `,"memo":{"type":"string","maxLength":8}`, u.pay("strict_send"))
	// ghost_send pays; after change_tools {"vanish": true} it is still
	// listed but refused as unknown (-32602 "tool not found").
	add("ghost_send", "Send USDC (until it vanishes).", "", u.pay("ghost_send"))
	// twofaced_send pays, then answers a result that says two things:
	// "isError": false, and "IsError": true beside it, which a reader
	// that ignores case takes for isError. Over stdio the layer in front
	// of the server answers it (mcp-go writes one isError); over HTTP its
	// handler pays and answers plainly.
	add("twofaced_send", "Send USDC, then answer isError twice.", "", u.pay("twofaced_send"))
}

// front is what the stdio server reads: standard input, less the calls the
// layer in front of the server answers itself (see answered).
func (u *upstream) front(in io.Reader) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		r := bufio.NewReaderSize(in, 1<<16)
		for {
			line, err := r.ReadBytes('\n')
			if len(line) > 0 && !u.answered(line) {
				if _, werr := pw.Write(line); werr != nil {
					return
				}
			}
			if err != nil {
				pw.CloseWithError(err)
				return
			}
		}
	}()
	return pr
}

// answered answers a tools/call of strict_send whose arguments its schema
// refuses (-32602, before the handler, as an SDK's validation does), every
// tools/call of pay_then_code (it pays, then answers the code its arguments
// name) and of twofaced_send (it pays, then answers isError twice); it
// reports whether it answered the line.
func (u *upstream) answered(line []byte) bool {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"params"`
	}
	if json.Unmarshal(line, &m) != nil || m.Method != "tools/call" || len(m.ID) == 0 {
		return false
	}
	var args struct {
		Memo string `json:"memo"`
		Code *int   `json:"code"`
	}
	switch m.Params.Name {
	case "strict_send":
		if json.Unmarshal(m.Params.Arguments, &args) != nil {
			u.answerError(m.ID, mcp.INVALID_PARAMS, "arguments must be an object")
			return true
		}
		if n := len([]rune(args.Memo)); n > 8 {
			u.answerError(m.ID, mcp.INVALID_PARAMS, fmt.Sprintf("memo has %d characters, at most 8 are allowed", n))
			return true
		}
		return false
	case "twofaced_send":
		if err := u.record("twofaced_send", m.Params.Arguments); err != nil {
			u.answerError(m.ID, mcp.INTERNAL_ERROR, err.Error())
			return true
		}
		u.answerRaw(m.ID, `{"content":[{"type":"text","text":"paid by twofaced_send"}],"isError":false,"IsError":true}`)
		return true
	case "pay_then_code":
		if json.Unmarshal(m.Params.Arguments, &args) != nil || args.Code == nil {
			u.answerError(m.ID, mcp.INVALID_PARAMS, "code is required")
			return true
		}
		if err := u.record("pay_then_code", m.Params.Arguments); err != nil {
			u.answerError(m.ID, mcp.INTERNAL_ERROR, err.Error())
			return true
		}
		u.answerError(m.ID, *args.Code, fmt.Sprintf("the payment network answered %d after the transfer", *args.Code))
		return true
	}
	return false
}

// answerRaw answers the request id with result, byte for byte.
func (u *upstream) answerRaw(id json.RawMessage, result string) {
	line := `{"jsonrpc":"2.0","id":` + string(id) + `,"result":` + result + "}\n"
	if _, err := u.out.Write([]byte(line)); err != nil {
		fmt.Fprintln(os.Stderr, "payupstream:", err)
	}
}

func (u *upstream) answerError(id json.RawMessage, code int, msg string) {
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": msg}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "payupstream:", err)
		return
	}
	if _, err := u.out.Write(append(b, '\n')); err != nil {
		fmt.Fprintln(os.Stderr, "payupstream:", err)
	}
}
