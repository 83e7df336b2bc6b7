package server

import (
	"bytes"
	"container/list"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth"
)

// Session ids are minted here, not by mcp-go, so that an id the server did
// not issue is recognised without a table lookup and creates no state:
//
//	s1.<22 chars: 16 random bytes>.<22 chars: HMAC-SHA256(key, subject, random)[:16]>
//
// The MAC binds the id to the token subject that opened it: another
// subject presenting it gets 404 like any unknown id. The key is the
// --http-session-key file when given; otherwise it is derived from the
// resource URL, so that the replicas of one deployment accept each other's
// ids with no configuration and no affinity. A derived key is not secret:
// someone who knows the derivation can make a valid id for their own
// subject only, which gives nothing initialize would not (the same table
// bound, the same rate limit). A key file makes ids unforgeable.
const (
	sessionIDPrefix = "s1."
	sessionRandLen  = 16
	sessionMACLen   = 16
	minSessionKey   = 32
	maxSessionKey   = 4 << 10
)

var (
	errUnknownSession = errors.New("session not found")
	errStreamBusy     = errors.New("the session already has a live stream")
	errStreamIdle     = errors.New("stream idle")
	errStreamEvicted  = errors.New("session evicted")
	errStreamEnded    = errors.New("session terminated")
	errStreamWrite    = errors.New("keep-alive write failed")
	errShuttingDown   = errors.New("server shutting down")
)

var sidEncoding = base64.RawURLEncoding

// loadSessionKey reads the session key file, or derives the key from the
// resource URL when path is empty.
func loadSessionKey(path, resource string) ([]byte, error) {
	if path == "" {
		sum := sha256.Sum256([]byte("haia-trace-mcp session key v1\x00" + resource))
		return sum[:], nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("session key file: %w", err)
	}
	defer f.Close()
	buf := make([]byte, maxSessionKey+1)
	n, err := f.Read(buf)
	if err != nil {
		return nil, fmt.Errorf("session key file %s: read: %w", path, err)
	}
	if n > maxSessionKey {
		return nil, fmt.Errorf("session key file %s is larger than %d bytes", path, maxSessionKey)
	}
	key := bytes.TrimRight(buf[:n], " \t\r\n")
	if len(key) < minSessionKey {
		return nil, fmt.Errorf("session key file %s holds %d bytes; want at least %d (e.g. head -c 32 /dev/urandom | base64 > %s)", path, len(key), minSessionKey, path)
	}
	return key, nil
}

// sessionEntry is what the table knows of one session id.
type sessionEntry struct {
	id         string
	last       time.Time
	terminated bool          // a DELETE ended it; kept as a tombstone so the id answers 404
	stream     *streamHandle // its live GET stream, if any
	// progress counts the progress notifications written on any of the
	// session's responses: mcp-go hands one to whichever of them takes
	// it first (Stream).
	progress *Stream
}

// dropReason labels why an entry left the table.
type dropReason string

const (
	dropCapacity dropReason = "capacity"
	dropIdle     dropReason = "idle"
)

// sessionTable holds every session id this process keeps state for: the
// ids it minted, the valid ids it was shown, and tombstones of terminated
// ones. It never holds more than max entries: the least recently active
// one is dropped first, and entries idle for longer than idle are dropped
// as soon as the table is next touched. Dropping an entry ends its stream
// and removes the state mcp-go keeps under that id.
type sessionTable struct {
	key    []byte
	max    int
	idle   time.Duration
	now    func() time.Time
	onDrop func(id string, why dropReason) // called without the lock held

	size    prometheus.Gauge
	dropped *prometheus.CounterVec

	mu   sync.Mutex
	byID map[string]*list.Element
	lru  *list.List // of *sessionEntry; front = most recently active
}

func newSessionTable(key []byte, max int, idle time.Duration, size prometheus.Gauge, dropped *prometheus.CounterVec) *sessionTable {
	return &sessionTable{key: key, max: max, idle: idle, now: time.Now, size: size, dropped: dropped,
		byID: map[string]*list.Element{}, lru: list.New()}
}

func (t *sessionTable) mac(subject string, random []byte) []byte {
	m := hmac.New(sha256.New, t.key)
	m.Write([]byte("haia-trace-mcp session v1\x00"))
	m.Write([]byte(subject))
	m.Write([]byte{0})
	m.Write(random)
	return m.Sum(nil)[:sessionMACLen]
}

// valid reports whether id was minted by a holder of the key for subject.
func (t *sessionTable) valid(subject, id string) bool {
	rest, ok := strings.CutPrefix(id, sessionIDPrefix)
	if !ok {
		return false
	}
	r64, m64, ok := strings.Cut(rest, ".")
	if !ok {
		return false
	}
	random, err := sidEncoding.Strict().DecodeString(r64)
	if err != nil || len(random) != sessionRandLen {
		return false
	}
	tag, err := sidEncoding.Strict().DecodeString(m64)
	if err != nil || len(tag) != sessionMACLen {
		return false
	}
	return hmac.Equal(tag, t.mac(subject, random))
}

// mint issues a new id for subject and enters it in the table.
func (t *sessionTable) mint(subject string) string {
	random := make([]byte, sessionRandLen)
	if _, err := rand.Read(random); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err)) // the runtime guarantees it does not
	}
	id := sessionIDPrefix + sidEncoding.EncodeToString(random) + "." + sidEncoding.EncodeToString(t.mac(subject, random))
	t.admit(subject, id)
	return id
}

// admitResult is what a request naming a session id may do.
type admitResult int

const (
	admitted admitResult = iota
	admitTerminated
	admitUnknown
)

// admit checks id for subject and, when it is valid and live, records the
// activity (entering the id if this process holds nothing for it yet). An
// invalid id changes nothing.
func (t *sessionTable) admit(subject, id string) admitResult {
	if !t.valid(subject, id) {
		return admitUnknown
	}
	var victims []*sessionEntry
	var reasons []dropReason
	res := admitted
	t.mu.Lock()
	now := t.now()
	if el, ok := t.byID[id]; ok {
		e := el.Value.(*sessionEntry)
		if e.terminated {
			res = admitTerminated
		} else {
			e.last = now
			t.lru.MoveToFront(el)
		}
	} else {
		victims, reasons = t.makeRoomLocked(now)
		t.byID[id] = t.lru.PushFront(&sessionEntry{id: id, last: now, progress: &Stream{}})
	}
	t.size.Set(float64(len(t.byID)))
	t.mu.Unlock()
	t.finish(victims, reasons)
	return res
}

// makeRoomLocked drops idle entries, then the least recently active ones
// until there is room for one more.
func (t *sessionTable) makeRoomLocked(now time.Time) ([]*sessionEntry, []dropReason) {
	var victims []*sessionEntry
	var reasons []dropReason
	for el := t.lru.Back(); el != nil; {
		e := el.Value.(*sessionEntry)
		if now.Sub(e.last) < t.idle {
			break
		}
		prev := el.Prev()
		t.removeLocked(el)
		victims, reasons = append(victims, e), append(reasons, dropIdle)
		el = prev
	}
	for len(t.byID) >= t.max {
		el := t.lru.Back()
		e := el.Value.(*sessionEntry)
		t.removeLocked(el)
		victims, reasons = append(victims, e), append(reasons, dropCapacity)
	}
	return victims, reasons
}

func (t *sessionTable) removeLocked(el *list.Element) {
	e := el.Value.(*sessionEntry)
	delete(t.byID, e.id)
	t.lru.Remove(el)
	if e.stream != nil {
		e.stream.cancel(errStreamEvicted)
	}
}

func (t *sessionTable) finish(victims []*sessionEntry, reasons []dropReason) {
	for i, e := range victims {
		t.dropped.WithLabelValues(string(reasons[i])).Inc()
		if t.onDrop != nil && !e.terminated {
			t.onDrop(e.id, reasons[i])
		}
	}
}

// terminate turns a live entry into a tombstone and ends its stream.
func (t *sessionTable) terminate(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.byID[id]
	if !ok {
		return
	}
	e := el.Value.(*sessionEntry)
	e.terminated = true
	e.last = t.now()
	t.lru.MoveToFront(el)
	if e.stream != nil {
		e.stream.cancel(errStreamEnded)
		e.stream = nil
	}
}

// attach records h as id's live stream; a session has at most one.
func (t *sessionTable) attach(id string, h *streamHandle) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.byID[id]
	if !ok {
		return errUnknownSession // dropped between admit and attach
	}
	e := el.Value.(*sessionEntry)
	if e.terminated {
		return errUnknownSession
	}
	if e.stream != nil {
		return errStreamBusy
	}
	e.stream = h
	return nil
}

// detach forgets h if it is still id's stream.
func (t *sessionTable) detach(id string, h *streamHandle) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if el, ok := t.byID[id]; ok {
		if e := el.Value.(*sessionEntry); e.stream == h {
			e.stream = nil
		}
	}
}

// progressOf returns the progress counter of id's live session, or nil
// when the table holds none.
func (t *sessionTable) progressOf(id string) *Stream {
	t.mu.Lock()
	defer t.mu.Unlock()
	if el, ok := t.byID[id]; ok {
		if e := el.Value.(*sessionEntry); !e.terminated {
			return e.progress
		}
	}
	return nil
}

// sessionStream makes the session's progress counter the one r's response
// writes to and r's handlers see (StreamFrom), when r names a session the
// table holds for r's subject; otherwise r keeps the counter of its own
// response (another subject's id is refused later, and counts on nothing
// of that session).
func (h *HTTP) sessionStream(r *http.Request) *http.Request {
	id := r.Header.Get(mcpserver.HeaderKeySessionID)
	if id == "" {
		return r
	}
	n, ok := r.Context().Value(reqNoteKey{}).(*reqNote)
	if !ok || n.writer == nil {
		return r
	}
	sub, _ := auth.SubjectFrom(r.Context())
	if !h.sessions.valid(sub, id) {
		return r
	}
	st := h.sessions.progressOf(id)
	if st == nil {
		return r
	}
	n.writer.stream = st
	return r.WithContext(context.WithValue(r.Context(), streamKey{}, st))
}

// touch records activity on a live entry without entering anything.
func (t *sessionTable) touch(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if el, ok := t.byID[id]; ok {
		if e := el.Value.(*sessionEntry); !e.terminated {
			e.last = t.now()
			t.lru.MoveToFront(el)
		}
	}
}

// len is the number of entries, tombstones included.
func (t *sessionTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID)
}

// internalKey marks the requests the HTTP front sends to mcp-go itself to
// drop a session's state; their Terminate must not be checked against a
// subject.
type internalKey struct{}

// sessionResolver hands mcp-go a session id manager bound to the subject
// of each request.
type sessionResolver struct{ t *sessionTable }

func (r sessionResolver) ResolveSessionIdManager(req *http.Request) mcpserver.SessionIdManager {
	if req == nil || req.Context().Value(internalKey{}) != nil {
		// mcp-go's own calls (shutdown) and the front's state drops.
		return internalManager{}
	}
	sub, _ := auth.SubjectFrom(req.Context())
	return sessionManager{t: r.t, subject: sub}
}

type sessionManager struct {
	t       *sessionTable
	subject string
}

func (m sessionManager) Generate() string { return m.t.mint(m.subject) }

func (m sessionManager) Validate(id string) (bool, error) {
	switch m.t.admit(m.subject, id) {
	case admitted:
		return false, nil
	case admitTerminated:
		return true, nil
	default:
		return false, errUnknownSession
	}
}

func (m sessionManager) Terminate(id string) (bool, error) {
	if !m.t.valid(m.subject, id) {
		return false, errUnknownSession
	}
	m.t.terminate(id)
	return false, nil
}

// internalManager accepts everything: it is used only for requests the
// server makes to itself.
type internalManager struct{}

func (internalManager) Generate() string               { return "" }
func (internalManager) Validate(string) (bool, error)  { return false, nil }
func (internalManager) Terminate(string) (bool, error) { return false, nil }

// discardResponse is the response writer of the front's internal requests.
type discardResponse struct{ h http.Header }

func (d *discardResponse) Header() http.Header {
	if d.h == nil {
		d.h = http.Header{}
	}
	return d.h
}
func (d *discardResponse) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardResponse) WriteHeader(int)             {}

// dropMCPState removes what mcp-go keeps under a session id (its
// registration, log level, per-session tools) through the one public way
// it offers: a DELETE for that id.
func (h *HTTP) dropMCPState(id string, why dropReason) {
	ctx := context.WithValue(context.Background(), internalKey{}, true)
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, "/mcp", nil)
	if err != nil {
		return
	}
	req.Header.Set(mcpserver.HeaderKeySessionID, id)
	h.mcp.ServeHTTP(&discardResponse{}, req)
	h.logger.Debug("session state dropped", "reason", string(why))
}

// writeSessionError answers with a JSON-RPC error body and an HTTP status.
func writeSessionError(w http.ResponseWriter, status, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"jsonrpc": "2.0", "id": nil,
		"error": map[string]any{"code": code, "message": msg},
	})
}

// gate sits in front of mcp-go on /mcp. It answers 404 to a session id the
// server did not issue (for this subject) before mcp-go can create state
// for it — mcp-go does not check the id of a GET at all — and runs GET
// streams and subscriptions/listen streams under the stream bounds.
func (h *HTTP) gate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		modern := mcp.IsModernProtocol(r.Header.Get(mcp.HeaderProtocolVersion))
		switch {
		case r.Method == http.MethodPost:
			if isListenRequest(r) {
				h.serveStream(w, r, "", next)
				return
			}
			r = h.sessionStream(r)
			if h.fair != nil {
				h.fair.admit(w, r, next, h.logger)
				return
			}
			next.ServeHTTP(w, r) // mcp-go checks the id through sessionManager.Validate
		case (r.Method == http.MethodGet || r.Method == http.MethodDelete) && !modern:
			id := r.Header.Get(mcpserver.HeaderKeySessionID)
			if id == "" {
				writeSessionError(w, http.StatusBadRequest, mcp.INVALID_REQUEST,
					r.Method+" /mcp needs the Mcp-Session-Id header that initialize returned")
				return
			}
			sub, _ := auth.SubjectFrom(r.Context())
			switch h.sessions.admit(sub, id) {
			case admitUnknown:
				writeSessionError(w, http.StatusNotFound, -32001, "session not found: start a new session with initialize")
				return
			case admitTerminated:
				writeSessionError(w, http.StatusNotFound, -32001, "session terminated: start a new session with initialize")
				return
			}
			if r.Method == http.MethodGet {
				h.serveStream(w, h.sessionStream(r), id, next)
				return
			}
			next.ServeHTTP(w, r)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// isListenRequest reports whether a POST opens a long-lived stream
// (subscriptions/listen, protocol 2026-07-28), from the body limitBody
// kept in memory.
func isListenRequest(r *http.Request) bool {
	n, ok := r.Context().Value(reqNoteKey{}).(*reqNote)
	if !ok || len(n.body) == 0 {
		return false
	}
	var m struct {
		Method string `json:"method"`
	}
	return json.Unmarshal(n.body, &m) == nil && m.Method == string(mcp.MethodSubscriptionsListen)
}

// streamHandle is one live stream; cancelling it ends the stream.
type streamHandle struct {
	cancel context.CancelCauseFunc
}

// streamSet counts and ends the live streams.
type streamSet struct {
	max   int
	gauge prometheus.Gauge
	mu    sync.Mutex
	live  map[*streamHandle]struct{}
}

func (s *streamSet) add(h *streamHandle) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.live) >= s.max {
		return false
	}
	s.live[h] = struct{}{}
	s.gauge.Set(float64(len(s.live)))
	return true
}

func (s *streamSet) remove(h *streamHandle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.live, h)
	s.gauge.Set(float64(len(s.live)))
}

func (s *streamSet) closeAll(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for h := range s.live {
		h.cancel(cause)
	}
}

// serveStream runs one long-lived response under the stream bounds: at
// most MaxStreams at once (then 503 with Retry-After), one per session
// (then 409), an SSE comment every StreamPing so that proxies see traffic,
// and closed after StreamIdle without a message from the server. The write
// deadline is pushed forward with each write, so a client that stops
// reading is dropped within two ping periods and the server's write
// timeout does not cut a healthy stream.
func (h *HTTP) serveStream(w http.ResponseWriter, r *http.Request, sessionID string, next http.Handler) {
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	handle := &streamHandle{cancel: cancel}
	if !h.streams.add(handle) {
		w.Header().Set("Retry-After", "5")
		writeSessionError(w, http.StatusServiceUnavailable, -32002, fmt.Sprintf("too many live streams (limit %d): retry later", h.streams.max))
		return
	}
	defer h.streams.remove(handle)
	if sessionID != "" {
		if err := h.sessions.attach(sessionID, handle); err != nil {
			if errors.Is(err, errStreamBusy) {
				writeSessionError(w, http.StatusConflict, -32003, "this session already has a live stream; close it first")
			} else {
				writeSessionError(w, http.StatusNotFound, -32001, "session not found: start a new session with initialize")
			}
			return
		}
		defer h.sessions.detach(sessionID, handle)
	}
	sw := &streamWriter{ResponseWriter: w, rc: http.NewResponseController(w), grace: h.streamPing + streamWriteGrace}
	sw.opened = time.Now()
	sw.lastData = sw.opened
	// The request was read in full; a stream must outlive the server's
	// read timeout, whose expiry would otherwise cancel it.
	_ = sw.rc.SetReadDeadline(time.Time{})
	_ = sw.rc.SetWriteDeadline(time.Now().Add(sw.grace))
	sw.onData = func() {
		if sessionID != "" {
			h.sessions.touch(sessionID)
		}
	}

	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { h.keepAlive(ctx, cancel, sw, done) })
	next.ServeHTTP(sw, r.WithContext(ctx))
	close(done)
	wg.Wait()

	cause := context.Cause(ctx)
	reason := "closed"
	switch {
	case errors.Is(cause, errStreamIdle):
		reason = "idle"
	case errors.Is(cause, errStreamEvicted):
		reason = "evicted"
	case errors.Is(cause, errStreamEnded):
		reason = "terminated"
	case errors.Is(cause, errStreamWrite):
		reason = "write_failed"
	case errors.Is(cause, errShuttingDown):
		reason = "shutdown"
	case r.Context().Err() != nil:
		reason = "client_gone"
	}
	h.metrics.streamsClosed.WithLabelValues(reason).Inc()
	h.logger.Debug("stream closed", "reason", reason, "lasted", time.Since(sw.opened).Round(time.Millisecond))
}

// streamWriteGrace is added to the ping period for each write deadline.
const streamWriteGrace = 10 * time.Second

// keepAlive pings and closes the stream when it has been idle too long.
func (h *HTTP) keepAlive(ctx context.Context, cancel context.CancelCauseFunc, sw *streamWriter, done <-chan struct{}) {
	timer := time.NewTimer(h.streamPing)
	defer timer.Stop()
	lastPing := time.Now()
	for {
		now := time.Now()
		idleAt := sw.lastDataAt().Add(h.streamIdle)
		if !now.Before(idleAt) {
			cancel(errStreamIdle)
			return
		}
		pingAt := lastPing.Add(h.streamPing)
		wake := min(idleAt.Sub(now), pingAt.Sub(now))
		timer.Reset(max(wake, 0))
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if now = time.Now(); !now.Before(pingAt) {
			if err := sw.ping(); err != nil {
				cancel(fmt.Errorf("%w: %w", errStreamWrite, err))
				return
			}
			lastPing = now
		}
	}
}

// streamWriter serialises mcp-go's writes and the keep-alive comments on
// one response, and notes when the server last sent a message.
type streamWriter struct {
	http.ResponseWriter
	rc     *http.ResponseController
	grace  time.Duration
	onData func()
	opened time.Time

	mu       sync.Mutex
	sse      bool // headers sent, as text/event-stream
	lastData time.Time
}

func (s *streamWriter) WriteHeader(code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sse = code == http.StatusOK && strings.HasPrefix(s.ResponseWriter.Header().Get("Content-Type"), "text/event-stream")
	s.ResponseWriter.WriteHeader(code)
}

func (s *streamWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.grace))
	n, err := s.ResponseWriter.Write(b)
	s.lastData = time.Now()
	s.mu.Unlock()
	if s.onData != nil {
		s.onData()
	}
	return n, err
}

func (s *streamWriter) Flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.rc.Flush()
}

func (s *streamWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *streamWriter) lastDataAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastData
}

// ping writes an SSE comment, once the response is an event stream.
func (s *streamWriter) ping() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.sse {
		return nil
	}
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.grace))
	if _, err := s.ResponseWriter.Write([]byte(": ping\n\n")); err != nil {
		return err
	}
	return s.rc.Flush()
}
