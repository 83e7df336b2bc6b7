package notify

import (
	"bytes"
	"fmt"
	"log/slog"
	"sync"
	"testing"
)

// logBuffer collects log output from several goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func testLogger() (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

// testReview is shaped like reviewlog.Review, which this package does not import.
type testReview struct {
	ID           string `json:"review_id"`
	Status       string `json:"status"`
	Counterparty string `json:"counterparty"`
	Amount       string `json:"amount"`
	Asset        string `json:"asset"`
	DecidedBy    string `json:"decided_by,omitempty"`
	Reasons      []struct {
		Rule string `json:"rule"`
	} `json:"reasons"`
}

func reviewID(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", i) }

func message(t *testing.T, event string, i int) Message {
	t.Helper()
	r := testReview{ID: reviewID(i), Status: "pending", Counterparty: "0xb0b0000000000000000000000000000000000002", Amount: fmt.Sprintf("%d.50", i), Asset: "eip155:8453/0x833589fcd6edb6e08f4c7c32d4f71b54bda02913"}
	if event == EventDecided {
		r.Status, r.DecidedBy = "rejected", "alice"
	}
	m, err := NewMessage(event, r)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// delivered is what a receiver saw, decoded.
type delivered struct {
	Event  string     `json:"event"`
	Review testReview `json:"review"`
	Text   string     `json:"text"`
}
