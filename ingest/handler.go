package ingest

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"time"
)

// Path is where the batch endpoint is served.
const Path = "/v1/events:batch"

// KeyHeader carries the ingest key.
const KeyHeader = "x-haia-api-key"

// DefaultMaxBody bounds a batch body: 500 events of a few KiB each.
const DefaultMaxBody = 8 << 20

// DefaultMaxInFlight bounds the batches read and stored at once, so that
// recorders cannot take every core from the guard's decisions; a batch
// past it waits up to DefaultSlotWait for its turn, then is answered 429
// with Retry-After, which the writer honours.
const DefaultMaxInFlight = 2

// DefaultSlotWait is how long a batch waits for one of the slots.
const DefaultSlotWait = 10 * time.Second

// Config describes the batch endpoint.
type Config struct {
	Keys *Keys
	Sink Sink
	// Serves reports whether tenant is one this server serves ("" is the
	// root of a server without tenants).
	Serves func(tenant string) bool
	// MaxBody bounds a request body (413 past it); zero is DefaultMaxBody.
	MaxBody int64
	// MaxInFlight bounds the batches handled at once; zero is
	// DefaultMaxInFlight.
	MaxInFlight int
	// Observe, when set, is told each batch's outcome (for metrics).
	Observe func(tenant string, res Result, status int, took time.Duration)
	Logger  *slog.Logger
}

// Handler serves POST /v1/events:batch.
type Handler struct {
	cfg   Config
	slots chan struct{}
}

// NewHandler builds the batch endpoint.
func NewHandler(cfg Config) (*Handler, error) {
	if cfg.Keys == nil || cfg.Sink == nil || cfg.Serves == nil {
		return nil, errors.New("ingest: the handler needs keys, a sink and the tenants served")
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Handler{cfg: cfg, slots: make(chan struct{}, cfg.MaxInFlight)}, nil
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	var b errorBody
	b.Error.Code, b.Error.Message = code, msg
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(b)
}

// ServeHTTP authenticates the key, reads the batch, stores what is new and
// answers {accepted, duplicates, rejections}. The key itself is never
// logged: a log line names the key's public id.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	log := h.cfg.Logger
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "the batch endpoint takes POST")
		return
	}
	key := r.Header.Get(KeyHeader)
	if key == "" {
		writeError(w, http.StatusUnauthorized, "unauthenticated", "no ingest key: send it in the "+KeyHeader+" header")
		return
	}
	rec, err := h.cfg.Keys.Lookup(key)
	if err != nil {
		if !errors.Is(err, ErrUnknownKey) {
			log.ErrorContext(r.Context(), "ingest: the keys file cannot be read", "path", h.cfg.Keys.Path(), "err", err)
			writeError(w, http.StatusServiceUnavailable, "unavailable", "the server cannot check ingest keys now")
			return
		}
		log.WarnContext(r.Context(), "ingest: refused an unknown or revoked key", "key_id", keyID(key), "remote", r.RemoteAddr)
		writeError(w, http.StatusUnauthorized, "unauthenticated", "the ingest key is unknown or revoked")
		return
	}
	log = log.With("key_id", rec.ID, "tenant", rec.Tenant)
	if !h.cfg.Serves(rec.Tenant) {
		log.WarnContext(r.Context(), "ingest: the key's tenant is not served here")
		msg := "the ingest key's tenant is not served here"
		if rec.Tenant == "" {
			msg = "the ingest key names no tenant, and this server serves tenants: create one with ingest-key create --tenant NAME"
		}
		writeError(w, http.StatusForbidden, "forbidden", msg)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "the batch must be sent as application/json")
			return
		}
	}
	wait := time.NewTimer(DefaultSlotWait)
	select {
	case h.slots <- struct{}{}:
		wait.Stop()
		defer func() { <-h.slots }()
	case <-wait.C:
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, "busy", "the server is storing other batches; retry after a second")
		return
	case <-r.Context().Done():
		wait.Stop()
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBody))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			writeError(w, http.StatusRequestEntityTooLarge, "too_large", "the batch is larger than "+strconv.FormatInt(h.cfg.MaxBody, 10)+" bytes; send fewer events a request")
			return
		}
		writeError(w, http.StatusBadRequest, "bad_request", "the batch could not be read")
		return
	}
	events, rejections, err := ParseBatch(body)
	if err != nil {
		log.InfoContext(r.Context(), "ingest: refused a batch", "err", err.Error())
		writeError(w, http.StatusBadRequest, "invalid_batch", err.Error())
		h.observe(rec.Tenant, Result{}, http.StatusBadRequest, start)
		return
	}
	res := Result{Rejections: rejections}
	if res.Rejections == nil {
		res.Rejections = []Rejection{}
	}
	if len(events) > 0 {
		dup, err := h.cfg.Sink.Store(r.Context(), rec.Tenant, events)
		if err != nil {
			log.ErrorContext(r.Context(), "ingest: a batch could not be stored; the recorder retries it", "events", len(events), "err", err)
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, "unavailable", "the batch could not be stored; retry it")
			h.observe(rec.Tenant, Result{}, http.StatusServiceUnavailable, start)
			return
		}
		for _, d := range dup {
			if d {
				res.Duplicates++
			} else {
				res.Accepted++
			}
		}
	}
	if len(res.Rejections) > 0 {
		first := res.Rejections[0].Issues[0]
		log.InfoContext(r.Context(), "ingest: events rejected; the recorder reports them", "rejected", len(res.Rejections),
			"first_index", res.Rejections[0].Index, "first_code", first.Code, "first_field", first.Field)
	}
	log.DebugContext(r.Context(), "ingest: batch stored", "accepted", res.Accepted, "duplicates", res.Duplicates, "rejected", len(res.Rejections))
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
	h.observe(rec.Tenant, res, http.StatusOK, start)
}

func (h *Handler) observe(tenant string, res Result, status int, start time.Time) {
	if h.cfg.Observe != nil {
		h.cfg.Observe(tenant, res, status, time.Since(start))
	}
}
