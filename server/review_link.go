package server

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// A "review" answer asks a client that declared URL-mode elicitation to
// show its user the console page of the review (review_url). Since
// protocol 2026-07-28 a server asks through the tool's own result (multi
// round-trip requests, SEP-2322): the first call answers "input required"
// with the elicitation; the client shows the link and calls again with the
// user's response, and gets the answer. mcp-go plays the client's part for
// a client on an earlier protocol (a server-initiated elicitation/create),
// so one path serves both. The answer itself is computed once, on the first
// call, and kept for the retry under an unguessable state token bound to
// the caller; a retry this process cannot match (another replica, an
// expired token) is answered afresh, without asking again.
const (
	// reviewLinkInput keys the elicitation in the input requests.
	reviewLinkInput = "review_link"
	// linkStateTTL bounds how long an answer waits for the client's retry.
	linkStateTTL = 10 * time.Minute
	// maxLinkStates bounds the answers waiting (oldest dropped first).
	maxLinkStates = 1024
)

type roundTripKey struct{}

// withRoundTrip keeps a call's multi round-trip parameters for its handler.
func withRoundTrip(ctx context.Context, p mcp.MultiRoundTripParams) context.Context {
	return context.WithValue(ctx, roundTripKey{}, p)
}

func roundTripOf(ctx context.Context) mcp.MultiRoundTripParams {
	p, _ := ctx.Value(roundTripKey{}).(mcp.MultiRoundTripParams)
	return p
}

// linkStates holds the answers waiting for a client's retry.
type linkStates struct {
	mu      sync.Mutex
	entries map[string]linkState
}

type linkState struct {
	caller  string
	tool    string
	expires time.Time
	result  *mcp.CallToolResult
}

func (ls *linkStates) put(now time.Time, caller, tool string, res *mcp.CallToolResult) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "" // no token: the caller is answered without the link request
	}
	tok := base64.RawURLEncoding.EncodeToString(b)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.entries == nil {
		ls.entries = map[string]linkState{}
	}
	var oldest string
	for k, e := range ls.entries {
		if !now.Before(e.expires) {
			delete(ls.entries, k)
		} else if oldest == "" || e.expires.Before(ls.entries[oldest].expires) {
			oldest = k
		}
	}
	if len(ls.entries) >= maxLinkStates {
		delete(ls.entries, oldest)
	}
	ls.entries[tok] = linkState{caller: caller, tool: tool, expires: now.Add(linkStateTTL), result: res}
	return tok
}

// take returns (once) the answer kept under tok for caller's call of tool.
func (ls *linkStates) take(now time.Time, tok, caller, tool string) (*mcp.CallToolResult, bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	e, ok := ls.entries[tok]
	if !ok || e.caller != caller || e.tool != tool {
		return nil, false
	}
	delete(ls.entries, tok)
	if !now.Before(e.expires) {
		return nil, false
	}
	return e.result, true
}

// wantsReviewLink says whether the client declared URL-mode elicitation.
func wantsReviewLink(ctx context.Context) bool {
	info, ok := mcpserver.ClientSessionFromContext(ctx).(mcpserver.SessionWithClientInfo)
	if !ok {
		return false
	}
	caps := info.GetClientCapabilities()
	return caps.Elicitation != nil && caps.Elicitation.URL != nil
}

// retriedAnswer is the answer kept for a client's retry after it showed
// the link (ok false on a first call). A retry whose answer is not here
// is answered afresh by the caller, with again false so nothing is asked
// twice.
func (s *Server) retriedAnswer(ctx context.Context, tool string) (res *mcp.CallToolResult, retried bool) {
	rt := roundTripOf(ctx)
	if _, ok := rt.InputResponses[reviewLinkInput]; !ok {
		return nil, false
	}
	action := "unknown"
	if er := mcpserver.ElicitationResponse(rt.InputResponses, reviewLinkInput); er != nil {
		action = string(er.Action)
	}
	res, ok := s.links.take(s.cfg.Now(), rt.RequestState, s.callerID(ctx), tool)
	s.cfg.Logger.Info("the client answered the request to show the review's link", "tool", tool, "action", action, "answer_kept", ok)
	return res, true
}

// askToShowLink returns, in place of answer, the request that the client
// show its user the review's page — when the client declared URL-mode
// elicitation and this is not already the retry that followed it.
func (s *Server) askToShowLink(ctx context.Context, tool, reviewID, link string, retried bool, answer *mcp.CallToolResult) *mcp.CallToolResult {
	if retried || link == "" || reviewID == "" || !wantsReviewLink(ctx) {
		return answer
	}
	tok := s.links.put(s.cfg.Now(), s.callerID(ctx), tool, answer)
	if tok == "" {
		return answer
	}
	msg := "A payment your agent asked about waits for a human reviewer: review " + reviewID +
		". Open the reviewer console to approve or reject it with your passkey."
	return mcpserver.NewInputRequestBuilder(tok).Elicit(reviewLinkInput, mcp.ElicitationParams{
		Mode: mcp.ElicitationModeURL, Message: msg, ElicitationID: "review:" + reviewID, URL: link,
	}).ToolResult()
}
