package server

import (
	"bytes"
	"context"
	"sync"
	"time"
)

// Stream counts the progress notifications written on the responses of one
// MCP session over HTTP (of one request, outside a session the front
// holds), so that a tool handler that passed some on can wait until they
// are out before it returns its result. It counts the whole session's
// because mcp-go hands a session's notification to whichever of its
// responses takes it first: the call's own or the session's GET stream.
//
// Why: mcp-go (v1.2.1) hands a notification sent during a request to a
// forwarder goroutine, and when the handler's result comes back while the
// forwarder holds one it has taken but not yet written, the response path
// closes the stream first and the notification is dropped (mark3labs/mcp-go
// pull request #969, open). The last progress an upstream sends just before
// its result was lost about one call in three over HTTP. Over stdio the
// proxy writes notifications itself and nothing is lost.
type Stream struct {
	mu       sync.Mutex
	progress int64
	// changed is closed and replaced each time progress grows.
	changed chan struct{}
}

// progressEvent is how mcp-go writes a progress notification on an SSE
// response (writeSSEEvent of an mcp.JSONRPCNotification);
// TestStreamCountsProgressAsMCPGoWritesIt holds it to mcp-go's output.
var progressEvent = []byte(`event: message` + "\n" + `data: {"jsonrpc":"2.0","method":"notifications/progress"`)

type streamKey struct{}

// StreamFrom returns the HTTP response stream of ctx's request, or nil when
// the request did not come over HTTP.
func StreamFrom(ctx context.Context) *Stream {
	s, _ := ctx.Value(streamKey{}).(*Stream)
	return s
}

// Progress returns how many progress notifications the response has
// written.
func (s *Stream) Progress() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.progress
}

// WaitProgress waits until the response has written at least n progress
// notifications, at most max (a notification mcp-go gave to another of the
// session's streams is never written on this one), or until ctx ends. It
// reports whether n were written.
func (s *Stream) WaitProgress(ctx context.Context, n int64, max time.Duration) bool {
	timer := time.NewTimer(max)
	defer timer.Stop()
	for {
		s.mu.Lock()
		if s.progress >= n {
			s.mu.Unlock()
			return true
		}
		if s.changed == nil {
			s.changed = make(chan struct{})
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// wrote counts b when it is a progress notification's event.
func (s *Stream) wrote(b []byte) {
	if !bytes.HasPrefix(b, progressEvent) {
		return
	}
	s.mu.Lock()
	s.progress++
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	s.mu.Unlock()
}
