package server

import (
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
)

func TestLinkStates(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var ls linkStates
	res := mcp.NewToolResultText("the answer")
	tok := ls.put(now, "agent-1", "check_before_pay", res)
	if len(tok) != 43 {
		t.Fatalf("token %q", tok)
	}
	other := tok[:42] + "A"
	if tok[42] == 'A' {
		other = tok[:42] + "B"
	}
	for _, c := range []struct{ name, tok, caller, tool string }{
		{"another caller", tok, "agent-2", "check_before_pay"},
		{"another tool", tok, "agent-1", "authorize_payment"},
		{"another token", other, "agent-1", "check_before_pay"},
		{"no token", "", "agent-1", "check_before_pay"},
	} {
		if _, ok := ls.take(now, c.tok, c.caller, c.tool); ok {
			t.Errorf("%s took the answer", c.name)
		}
	}
	if got, ok := ls.take(now.Add(time.Minute), tok, "agent-1", "check_before_pay"); !ok || got != res {
		t.Fatal("the caller's retry did not get its answer")
	}
	if _, ok := ls.take(now, tok, "agent-1", "check_before_pay"); ok {
		t.Fatal("an answer was taken twice")
	}
	tok = ls.put(now, "agent-1", "check_before_pay", res)
	if _, ok := ls.take(now.Add(linkStateTTL), tok, "agent-1", "check_before_pay"); ok {
		t.Fatal("an expired answer was taken")
	}
	// Bounded: the oldest goes first.
	first := ls.put(now, "a", "t", res)
	for i := range maxLinkStates {
		ls.put(now.Add(time.Duration(i+1)*time.Millisecond), "a", "t", res)
	}
	if len(ls.entries) > maxLinkStates {
		t.Fatalf("%d answers kept", len(ls.entries))
	}
	if _, ok := ls.take(now, first, "a", "t"); ok {
		t.Fatal("the oldest answer was not dropped")
	}
}
