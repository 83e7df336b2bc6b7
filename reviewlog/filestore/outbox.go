package filestore

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// OutboxName is the file under guard/ that says which findings of the
// review log were told to a person (the PostgreSQL store's notify_outbox):
// one JSON line per claim and per delivery, appended under the log's lock.
const OutboxName = "notify-outbox.ndjson"

// outboxLine is one line of the outbox file: a claim (ClaimedBy) or a
// delivery (DeliveredBy).
type outboxLine struct {
	ID          string `json:"id"`
	At          string `json:"at"`
	ClaimedBy   string `json:"claimed_by,omitempty"`
	DeliveredBy string `json:"delivered_by,omitempty"`
}

type outboxState struct {
	claimedBy string
	claimedAt time.Time
	delivered bool
}

// ClaimNotifications takes, of due (outbox ids the review log records, in
// order), those nobody delivered and nobody else holds a claim on younger
// than lease, and claims them for owner; pending are the ids of due not
// delivered yet (claimed now, or held by another process). The first call
// on a store without the outbox file writes it with every id of due as
// delivered before (a store written by a version that told its findings
// at once), and claims nothing. Claims and deliveries are written under
// the review log's lock: two processes never claim one id at once.
func (s *Store) ClaimNotifications(ctx context.Context, owner string, due []string, lease time.Duration, now time.Time) (claimed, pending []string, err error) {
	err = s.Locked(ctx, 10*time.Second, func(w reviewlog.Writer) error {
		g := w.(*fileWriter).g
		state, exists, err := readOutbox(g.Path()+"/"+OutboxName, func() (*os.File, error) { return g.Open(OutboxName) })
		if err != nil {
			return err
		}
		var add []outboxLine
		at := now.UTC().Format(time.RFC3339Nano)
		if !exists {
			for _, id := range due {
				add = append(add, outboxLine{ID: id, At: at, DeliveredBy: "before the outbox"})
			}
			if len(add) == 0 {
				// Made now, empty: what the log records from here on is due.
				f, err := g.OpenFile(OutboxName, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
				if err != nil {
					return fmt.Errorf("the notification outbox %s/%s: %w", s.Describe(), OutboxName, err)
				}
				if err := f.Sync(); err != nil {
					f.Close()
					return err
				}
				return f.Close()
			}
			return appendOutbox(g, s.Describe(), add)
		}
		seen := map[string]bool{}
		for _, id := range due {
			if seen[id] {
				continue
			}
			seen[id] = true
			st := state[id]
			if st.delivered {
				continue
			}
			pending = append(pending, id)
			if st.claimedBy != "" && st.claimedBy != owner && now.Sub(st.claimedAt) < lease {
				continue
			}
			claimed = append(claimed, id)
			add = append(add, outboxLine{ID: id, At: at, ClaimedBy: owner})
		}
		if len(add) == 0 {
			return nil
		}
		return appendOutbox(g, s.Describe(), add)
	})
	if err != nil {
		return nil, nil, err
	}
	return claimed, pending, nil
}

// MarkNotified records that owner delivered the notification id.
func (s *Store) MarkNotified(ctx context.Context, owner, id string, now time.Time) error {
	return s.Locked(ctx, 10*time.Second, func(w reviewlog.Writer) error {
		g := w.(*fileWriter).g
		return appendOutbox(g, s.Describe(), []outboxLine{{ID: id, At: now.UTC().Format(time.RFC3339Nano), DeliveredBy: owner}})
	})
}

type dirFiles interface {
	OpenFile(name string, flag int, perm os.FileMode) (*os.File, error)
}

func appendOutbox(g dirFiles, where string, lines []outboxLine) error {
	var buf []byte
	for _, l := range lines {
		b, err := json.Marshal(l)
		if err != nil {
			return err
		}
		buf = append(append(buf, b...), '\n')
	}
	f, err := g.OpenFile(OutboxName, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("the notification outbox %s/%s: %w", where, OutboxName, err)
	}
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return fmt.Errorf("the notification outbox %s/%s: %w", where, OutboxName, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("the notification outbox %s/%s: %w", where, OutboxName, err)
	}
	return f.Close()
}

// readOutbox reads the outbox file; a line that does not read (a torn
// tail) is passed over: at worst a finding is told again.
func readOutbox(path string, open func() (*os.File, error)) (map[string]outboxState, bool, error) {
	f, err := open()
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("the notification outbox %s: %w", path, err)
	}
	defer f.Close()
	out := map[string]outboxState{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l outboxLine
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.ID == "" {
			continue
		}
		st := out[l.ID]
		switch {
		case l.DeliveredBy != "":
			st.delivered = true
		case l.ClaimedBy != "":
			at, err := time.Parse(time.RFC3339Nano, l.At)
			if err != nil {
				continue
			}
			st.claimedBy, st.claimedAt = l.ClaimedBy, at
		}
		out[l.ID] = st
	}
	if err := sc.Err(); err != nil {
		return nil, true, fmt.Errorf("the notification outbox %s: %w", path, err)
	}
	return out, true, nil
}
