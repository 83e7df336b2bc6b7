package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
)

// TestIngestThroughput measures, on the real binary, the events per second
// --ingest acknowledges (4 recorders posting batches of 500 events, each
// to its own run) and check_before_pay's answer time from one caller
// before and while they post, with the file store and (with
// HAIA_TEST_POSTGRES) PostgreSQL. HAIA_INGEST_BENCH=DURATION runs it (each
// phase that long); it prints the figures of docs/performance.md.
func TestIngestThroughput(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("HAIA_INGEST_BENCH"))
	if err != nil {
		t.Skip("set HAIA_INGEST_BENCH=DURATION (such as 20s) to measure ingest throughput")
	}
	stores := []string{"file:"}
	if os.Getenv(pgtest.Env) != "" {
		stores = append(stores, e2eDatabase(t))
	}
	for _, store := range stores {
		name := "files"
		if store != "file:" {
			name = "PostgreSQL"
		}
		root := sampleRoot(t)
		dir := t.TempDir()
		keys := filepath.Join(dir, "ingest-keys.json")
		key := newIngestKey(t, keys)
		p := startHTTPBinary(t, "--dir", root, "--key-file", filepath.Join(dir, "signing.pem"), "--store", store,
			"--http-insecure-no-auth", "--rate-limit", "100000", "--rate-burst", "100000", "--ingest", "--ingest-keys", keys)
		cs, err := httpSession(t, p.resource, func() string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		guard := func(ctx context.Context) []time.Duration {
			var lat []time.Duration
			for i := 0; ctx.Err() == nil; i++ {
				start := time.Now()
				res, err := askCheck(context.Background(), cs, "0.01")
				if err != nil || res.IsError {
					t.Errorf("check_before_pay: %v %v", err, res)
					return lat
				}
				lat = append(lat, time.Since(start))
			}
			return lat
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		before := guard(ctx)
		cancel()

		var acked atomic.Int64
		ctx, cancel = context.WithTimeout(context.Background(), d)
		var wg sync.WaitGroup
		client := &http.Client{Timeout: time.Minute}
		for w := range 4 {
			wg.Go(func() {
				for b := 0; ctx.Err() == nil; b++ {
					var sb strings.Builder
					sb.WriteString(`{"events":[`)
					for i := range 500 {
						if i > 0 {
							sb.WriteByte(',')
						}
						n := b*500 + i
						fmt.Fprintf(&sb, `{"event_type":"x402.payment.submitted","occurred_at":"2026-07-24T09:00:01.480Z","client_event_id":"w%d-%d","anonymous_id":"bench","session_id":"op-%d","properties":{"requirements":{"amount":"500000","asset":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913","max_timeout_seconds":300,"network":"base","pay_to":"0xC0C0000000000000000000000000000000000003","scheme":"exact"},"resource":{"description":"Paid resource","mime_type":"application/json","url":"https://c.example.org/data"},"x402_version":2,"seq":%d,"adapter":"trace-x402","role":"client","context_id":"op-%d"},"meta":{"source":"haia-trace","trace_schema":"v1","run_id":"bench-%d"}}`, w, n, n, n, n, w)
					}
					sb.WriteString(`]}`)
					req, _ := http.NewRequest(http.MethodPost, p.base+"/v1/events:batch", strings.NewReader(sb.String()))
					req.Header.Set("x-haia-api-key", key)
					req.Header.Set("Content-Type", "application/json")
					resp, err := client.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
					switch resp.StatusCode {
					case 200:
						acked.Add(500)
					case 429:
						time.Sleep(10 * time.Millisecond)
					default:
						t.Errorf("ingest: %d", resp.StatusCode)
						return
					}
				}
			})
		}
		start := time.Now()
		during := guard(ctx)
		wg.Wait()
		took := time.Since(start)
		cancel()
		// The same history, no longer changing: what is left is the cost
		// of reading the grown runs, not of ingest.
		ctx, cancel = context.WithTimeout(context.Background(), d)
		after := guard(ctx)
		cancel()
		q := func(l []time.Duration, f float64) time.Duration {
			if len(l) == 0 {
				return 0
			}
			l = slices.Clone(l)
			slices.Sort(l)
			return l[min(len(l)-1, int(f*float64(len(l))))].Round(100 * time.Microsecond)
		}
		t.Logf("%s: ingest %d events acknowledged in %s = %.0f events/s; check_before_pay p50/p99 %s/%s (%d answers) alone, %s/%s (%d answers) while ingest runs, %s/%s (%d answers) after it",
			name, acked.Load(), took.Round(time.Millisecond), float64(acked.Load())/took.Seconds(),
			q(before, 0.5), q(before, 0.99), len(before), q(during, 0.5), q(during, 0.99), len(during), q(after, 0.5), q(after, 0.99), len(after))
		p.stop(t)
	}
}
