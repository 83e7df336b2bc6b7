package pgstore

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Listen calls wake whenever a NOTIFY arrives on channel, and at least
// every interval (a notification can be missed while reconnecting), until
// ctx ends. A lost connection is reopened with a growing pause.
func (s *Store) Listen(ctx context.Context, channel string, interval time.Duration, wake func(), logger *slog.Logger) {
	listen(ctx, s.pool, s.describe, channel, interval, wake, logger)
}

// listen is Listen on pool, described as describe in the log.
func listen(ctx context.Context, pool *pgxpool.Pool, describe, channel string, interval time.Duration, wake func(), logger *slog.Logger) {
	pause := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := listenOnce(ctx, pool, channel, interval, wake, func() { pause = 100 * time.Millisecond })
		if ctx.Err() != nil {
			return
		}
		if logger != nil {
			logger.Warn("listening for store notifications failed; retrying", "store", describe, "channel", channel, "err", err, "retry_in", pause)
		}
		wake() // catch up on what the outage hid
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(pause*2, 5*time.Second)
	}
}

func listenOnce(ctx context.Context, pool *pgxpool.Pool, channel string, interval time.Duration, wake, connected func()) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return scrub(err)
	}
	// A connection that LISTENed must not go back to the pool: it is
	// taken out of it, and closed when listening ends.
	pc := conn.Hijack()
	defer pc.Close(context.WithoutCancel(ctx))
	if _, err := pc.Exec(ctx, "LISTEN "+quoteIdent(channel)); err != nil {
		return scrub(err)
	}
	connected()
	wake() // catch up on what came before the LISTEN
	for {
		wctx, cancel := context.WithTimeout(ctx, interval)
		_, err := pc.WaitForNotification(wctx)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil && wctx.Err() == nil {
			return scrub(err)
		}
		wake()
	}
}

func quoteIdent(s string) string { return `"` + s + `"` }

// outboxLease is how long a claim holds: a replica that died while
// delivering leaves its claims to the others after it.
const outboxLease = 2 * time.Minute

// ClaimOpened claims at most n opened reviews that no replica has
// notified yet (or whose claim lapsed), oldest first. Claims are taken
// with FOR UPDATE SKIP LOCKED: two replicas never claim the same review.
func (s *Store) ClaimOpened(ctx context.Context, owner string, n int) ([]string, error) {
	rows, err := s.pool.Query(ctx, `UPDATE notify_outbox SET claimed_by = $1, claimed_at = now()
		WHERE review_id IN (SELECT review_id FROM notify_outbox
			WHERE delivered_at IS NULL AND (claimed_at IS NULL OR claimed_at < now() - make_interval(secs => $2))
			ORDER BY opened_at LIMIT $3 FOR UPDATE SKIP LOCKED)
		RETURNING review_id`, owner, outboxLease.Seconds(), n)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: claim notifications: %w", s.describe, scrub(err))
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// MarkNotified records that owner delivered the notification of review id.
func (s *Store) MarkNotified(ctx context.Context, owner, id string) error {
	if _, err := s.pool.Exec(ctx, "UPDATE notify_outbox SET delivered_at = now() WHERE review_id = $1 AND claimed_by = $2", id, owner); err != nil {
		return fmt.Errorf("PostgreSQL at %s: mark notification: %w", s.describe, scrub(err))
	}
	return nil
}

// DispatchOpened delivers each opened review once across every replica
// running it: woken by NOTIFY (and every 30 s, for what a lapsed claim
// or a lost connection left), it claims what is
// due, hands each to deliver and marks it. It returns when ctx ends.
func (s *Store) DispatchOpened(ctx context.Context, owner string, deliver func(ctx context.Context, id string) error, logger *slog.Logger) {
	wake := make(chan struct{}, 1)
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	go s.Listen(ctx, Channel, 30*time.Second, poke, logger)
	poke()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
		}
		for ctx.Err() == nil {
			ids, err := s.ClaimOpened(ctx, owner, 32)
			if err != nil {
				if logger != nil && ctx.Err() == nil {
					logger.Warn("notification outbox", "err", err)
				}
				break
			}
			for _, id := range ids {
				if err := deliver(ctx, id); err != nil {
					if logger != nil {
						logger.Warn("notification not delivered; another replica retries after the lease", "review_id", id, "err", err, "lease", outboxLease)
					}
					continue
				}
				if err := s.MarkNotified(ctx, owner, id); err != nil && logger != nil {
					logger.Warn("notification delivered but not marked", "review_id", id, "err", err)
				}
			}
			if len(ids) < 32 {
				break
			}
		}
	}
}
