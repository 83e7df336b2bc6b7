package pgstore

import (
	"context"
	"fmt"
)

// MigrateTo brings a database to schema version v (an older release's), for
// tests of what a migration does to the rows an older release wrote.
func MigrateTo(ctx context.Context, dsn string, v int64) error {
	pool, err := connect(ctx, dsn, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	p, done, err := provider(pool, nil)
	if err != nil {
		return err
	}
	defer done()
	if _, err := p.UpTo(ctx, v); err != nil {
		return fmt.Errorf("migrate to %d: %w", v, err)
	}
	return nil
}
