// Command ingestload posts a Trace root's runs to a server's ingest
// endpoint (--ingest, POST /v1/events:batch) as the Control Plane writer
// would, so that a big root can be put into a store through the product's
// own ingest path (the PostgreSQL events table included). Each event line
// becomes one closed envelope (event_type, occurred_at, client_event_id =
// event_id, anonymous_id, session_id = context_id, properties = payload
// with seq, adapter, role and context_id spread over it, meta.run_id = the
// run file's name); a run's events go in file order, in batches of at most
// 500, each run by one worker. It reports the events acknowledged a
// second and fails on any rejection or error.
//
//	ingestload --url http://127.0.0.1:8080 --key KEY --dir ROOT [--from 0] [--to N] [--workers 4] [--batch 500]
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

type config struct {
	url, key, dir string
	from, to      int
	workers       int
	batch         int
}

func run(ctx context.Context, argv []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ingestload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	fs.StringVar(&c.url, "url", "", "the server's base URL (its --http address)")
	fs.StringVar(&c.key, "key", "", "an ingest key (ingest-key create)")
	fs.StringVar(&c.dir, "dir", "", "the Trace root whose events/*.ndjson are posted")
	fs.IntVar(&c.from, "from", 0, "the first run to post, by position among the run files sorted by name")
	fs.IntVar(&c.to, "to", 0, "the run after the last to post (0: every run from --from)")
	fs.IntVar(&c.workers, "workers", 4, "runs posted at once")
	fs.IntVar(&c.batch, "batch", 500, "events a batch (the writer's most is 500)")
	if err := fs.Parse(argv); err != nil {
		return 2
	}
	if c.url == "" || c.key == "" || c.dir == "" || c.workers < 1 || c.batch < 1 || c.batch > 500 || c.from < 0 {
		fmt.Fprintln(stderr, "ingestload: --url, --key and --dir are required; --workers ≥ 1; --batch 1..500")
		return 2
	}
	names, err := filepath.Glob(filepath.Join(c.dir, "events", "*.ndjson"))
	if err != nil {
		fmt.Fprintf(stderr, "ingestload: %v\n", err)
		return 1
	}
	slices.Sort(names)
	to := len(names)
	if c.to > 0 {
		to = min(to, c.to)
	}
	if c.from >= to {
		fmt.Fprintf(stderr, "ingestload: no run between %d and %d (%d runs in %s)\n", c.from, to, len(names), c.dir)
		return 2
	}
	names = names[c.from:to]
	client := &http.Client{Timeout: 5 * time.Minute}
	var acked, dups atomic.Int64
	var (
		mu   sync.Mutex
		errs []error
	)
	work := make(chan string)
	start := time.Now()
	var wg sync.WaitGroup
	for range c.workers {
		wg.Go(func() {
			for path := range work {
				a, d, err := postRun(ctx, client, c, path)
				acked.Add(a)
				dups.Add(d)
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s: %w", filepath.Base(path), err))
					mu.Unlock()
				}
			}
		})
	}
	for _, n := range names {
		work <- n
	}
	close(work)
	wg.Wait()
	took := time.Since(start)
	fmt.Fprintf(stdout, "ingestload: %d runs, %d events acknowledged (%d of them duplicates) in %s: %.0f events/s\n",
		len(names), acked.Load(), dups.Load(), took.Round(time.Millisecond), float64(acked.Load())/took.Seconds())
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintf(stderr, "ingestload: %v\n", err)
		return 1
	}
	return 0
}

// postRun posts one run file's events in order and returns how many were
// acknowledged and how many of those the server already held.
func postRun(ctx context.Context, client *http.Client, c config, path string) (acked, dups int64, err error) {
	run := strings.TrimSuffix(filepath.Base(path), ".ndjson")
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	var body bytes.Buffer
	n, line := 0, 0
	flush := func() error {
		if n == 0 {
			return nil
		}
		body.WriteString("]}")
		a, d, err := post(ctx, client, c, body.Bytes(), n)
		acked += a
		dups += d
		body.Reset()
		n = 0
		return err
	}
	for sc.Scan() {
		line++
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		env, err := envelope(sc.Bytes(), run)
		if err != nil {
			return acked, dups, fmt.Errorf("line %d: %w", line, err)
		}
		if n == 0 {
			body.WriteString(`{"events":[`)
		} else {
			body.WriteByte(',')
		}
		body.Write(env)
		n++
		if n == c.batch {
			if err := flush(); err != nil {
				return acked, dups, err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return acked, dups, err
	}
	return acked, dups, flush()
}

// event is the part of an Event Contract line the envelope is made of.
type event struct {
	ID         string          `json:"event_id"`
	Type       string          `json:"event_type"`
	OccurredAt string          `json:"occurred_at"`
	Seq        json.RawMessage `json:"seq"`
	Adapter    json.RawMessage `json:"adapter"`
	Role       json.RawMessage `json:"role"`
	ContextID  *string         `json:"context_id"`
	Payload    json.RawMessage `json:"payload"`
}

// envelope maps one Event Contract line to the Control Plane envelope the
// core package's writer posts for it.
func envelope(line []byte, run string) ([]byte, error) {
	var ev event
	if err := json.Unmarshal(line, &ev); err != nil {
		return nil, err
	}
	payload := bytes.TrimSpace(ev.Payload)
	if len(payload) < 2 || payload[0] != '{' {
		return nil, errors.New("payload is not an object")
	}
	inner := bytes.TrimSpace(payload[1 : len(payload)-1])
	var b bytes.Buffer
	str := func(s string) { j, _ := json.Marshal(s); b.Write(j) }
	b.WriteString(`{"event_type":`)
	str(ev.Type)
	b.WriteString(`,"occurred_at":`)
	str(ev.OccurredAt)
	b.WriteString(`,"client_event_id":`)
	str(ev.ID)
	b.WriteString(`,"anonymous_id":"ingestload"`)
	if ev.ContextID != nil {
		b.WriteString(`,"session_id":`)
		str(*ev.ContextID)
	}
	b.WriteString(`,"properties":{`)
	b.Write(inner)
	if len(inner) > 0 {
		b.WriteByte(',')
	}
	b.WriteString(`"seq":`)
	b.Write(ev.Seq)
	b.WriteString(`,"adapter":`)
	b.Write(ev.Adapter)
	if ev.Role != nil {
		b.WriteString(`,"role":`)
		b.Write(ev.Role)
	}
	if ev.ContextID != nil {
		b.WriteString(`,"context_id":`)
		str(*ev.ContextID)
	}
	b.WriteString(`},"meta":{"source":"haia-trace","trace_schema":"v1","run_id":`)
	str(run)
	b.WriteString(`}}`)
	return b.Bytes(), nil
}

// post sends one batch, again after a 429 or a 503, and checks that every
// event was taken.
func post(ctx context.Context, client *http.Client, c config, body []byte, n int) (acked, dups int64, err error) {
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(c.url, "/")+"/v1/events:batch", bytes.NewReader(body))
		if err != nil {
			return 0, 0, err
		}
		req.Header.Set("x-haia-api-key", c.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, 0, err
		}
		reply, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		switch {
		case (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) && attempt < 100:
			time.Sleep(50 * time.Millisecond)
			continue
		case resp.StatusCode != http.StatusOK:
			return 0, 0, fmt.Errorf("HTTP %d: %s", resp.StatusCode, reply)
		}
		var res struct {
			Accepted   int               `json:"accepted"`
			Duplicates int               `json:"duplicates"`
			Rejections []json.RawMessage `json:"rejections"`
		}
		if err := json.Unmarshal(reply, &res); err != nil {
			return 0, 0, fmt.Errorf("answer %q: %w", reply, err)
		}
		if len(res.Rejections) > 0 || res.Accepted+res.Duplicates != n {
			return int64(res.Accepted + res.Duplicates), int64(res.Duplicates), fmt.Errorf("%d events sent, %d accepted, %d duplicates, rejections %s", n, res.Accepted, res.Duplicates, res.Rejections)
		}
		return int64(n), int64(res.Duplicates), nil
	}
}
