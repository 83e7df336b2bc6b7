package ingest

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// benchBatch is a batch of 500 x402 events, each about 700 bytes.
func benchBatch(b *testing.B, run string, from int) []byte {
	b.Helper()
	var sb strings.Builder
	sb.WriteString(`{"events":[`)
	for i := range 500 {
		if i > 0 {
			sb.WriteByte(',')
		}
		n := from + i
		fmt.Fprintf(&sb, `{"event_type":"x402.payment.submitted","occurred_at":"2026-07-24T09:00:01.480Z","client_event_id":"e-%d","anonymous_id":"bench","session_id":"op-%d","properties":{"requirements":{"amount":"500000","asset":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913","max_timeout_seconds":300,"network":"base","pay_to":"0xC0C0000000000000000000000000000000000003","scheme":"exact"},"resource":{"description":"Paid resource","mime_type":"application/json","url":"https://c.example.org/data"},"x402_version":2,"seq":%d,"adapter":"trace-x402","role":"client","context_id":"op-%d"},"meta":{"source":"haia-trace","trace_schema":"v1","run_id":"%s"}}`, n, n, n, n, run)
	}
	sb.WriteString(`]}`)
	return []byte(sb.String())
}

// BenchmarkParseBatch reads and maps a batch of 500 events.
func BenchmarkParseBatch(b *testing.B) {
	body := benchBatch(b, "r", 0)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if ev, rej, err := ParseBatch(body); err != nil || len(rej) > 0 || len(ev) != 500 {
			b.Fatal(err, rej)
		}
	}
}

// BenchmarkFileSinkStore appends batches of 500 new events to one run,
// each synced.
func BenchmarkFileSinkStore(b *testing.B) {
	s := NewFileSink(map[string]string{"": b.TempDir()})
	defer s.Close()
	n := 0
	for b.Loop() {
		b.StopTimer()
		events, _, err := ParseBatch(benchBatch(b, "r", n))
		n += 500
		b.StartTimer()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Store(context.Background(), "", events); err != nil {
			b.Fatal(err)
		}
	}
}
