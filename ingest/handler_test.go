package ingest

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type failingSink struct{}

func (failingSink) Store(context.Context, string, []Event) ([]bool, error) {
	return nil, errors.New("disk full at /secret/path")
}

func TestHandlerAnswers(t *testing.T) {
	path := filepath.Join(t.TempDir(), KeysFileName)
	key, _, err := NewKey(path, "", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	keys, err := OpenKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	serves := func(tenant string) bool { return tenant == "" }
	good, err := NewHandler(Config{Keys: keys, Sink: NewFileSink(map[string]string{"": t.TempDir()}), Serves: serves, MaxBody: 4096, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	broken, _ := NewHandler(Config{Keys: keys, Sink: failingSink{}, Serves: serves, Logger: logger})
	event := wire(t, lineBare, "r1")
	for _, c := range []struct {
		name        string
		h           *Handler
		method, ct  string
		body        string
		status      int
		want, retry string
	}{
		{"GET", good, http.MethodGet, "", "", 405, "takes POST", ""},
		{"text/plain", good, http.MethodPost, "text/plain", `{"events":[]}`, 415, "application/json", ""},
		{"charset is fine", good, http.MethodPost, "application/json; charset=utf-8", `{"events":[` + event + `]}`, 200, `{"accepted":1,"duplicates":0,"rejections":[]}`, ""},
		{"a retry", good, http.MethodPost, "application/json", `{"events":[` + event + `]}`, 200, `{"accepted":0,"duplicates":1,"rejections":[]}`, ""},
		{"empty batch", good, http.MethodPost, "application/json", `{"events":[]}`, 200, `{"accepted":0,"duplicates":0,"rejections":[]}`, ""},
		{"over the body bound", good, http.MethodPost, "application/json", `{"events":[` + strings.Repeat(" ", 5000) + `]}`, 413, "larger than 4096 bytes", ""},
		{"the store fails", broken, http.MethodPost, "application/json", `{"events":[` + event + `]}`, 503, "retry it", "1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := httptest.NewRequest(c.method, Path, strings.NewReader(c.body))
			req.Header.Set(KeyHeader, key)
			if c.ct != "" {
				req.Header.Set("Content-Type", c.ct)
			}
			rec := httptest.NewRecorder()
			c.h.ServeHTTP(rec, req)
			if rec.Code != c.status || !strings.Contains(rec.Body.String(), c.want) || rec.Header().Get("Retry-After") != c.retry {
				t.Fatalf("%d %s (Retry-After %q), want %d with %q", rec.Code, rec.Body, rec.Header().Get("Retry-After"), c.status, c.want)
			}
			if strings.Contains(rec.Body.String(), "/secret/path") {
				t.Fatal("the store's error reached the client")
			}
		})
	}
	if strings.Contains(logs.String(), key[len(key)-43:]) {
		t.Fatal("the key is in the log")
	}
	if !strings.Contains(logs.String(), "disk full") {
		t.Fatal("the store's error is not in the log")
	}
}
