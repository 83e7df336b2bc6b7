package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// signInsKept is how long past its expiry a used sign-in challenge stays
// recorded: far beyond any clock skew between a replica and the database,
// so no replica whose clock is behind still takes a challenge whose row
// is gone.
const signInsKept = time.Hour

// UseSignIn records that the console sign-in challenge whose SHA-256 is id
// was used, until expires, and reports whether it was new: false when any
// replica recorded it first (the primary key decides, at commit). Rows
// whose challenge expired more than an hour ago are removed on the way.
func (s *Store) UseSignIn(ctx context.Context, id []byte, expires time.Time) (bool, error) {
	if len(id) != 32 {
		return false, errors.New("a used sign-in is recorded by the 32-byte SHA-256 of its challenge")
	}
	ctx, cancel := context.WithTimeout(ctx, statementTimeout)
	defer cancel()
	if _, err := s.pool.Exec(ctx, "DELETE FROM console_signins WHERE expires_at < now() - make_interval(secs => $1)", signInsKept.Seconds()); err != nil {
		return false, fmt.Errorf("PostgreSQL at %s: remove expired sign-ins: %w", s.describe, scrub(err))
	}
	tag, err := s.pool.Exec(ctx, "INSERT INTO console_signins (challenge, expires_at) VALUES ($1, $2) ON CONFLICT (challenge) DO NOTHING", id, expires)
	if err != nil {
		return false, fmt.Errorf("PostgreSQL at %s: record a used sign-in: %w", s.describe, scrub(err))
	}
	return tag.RowsAffected() == 1, nil
}
