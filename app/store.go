package app

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

// IsFileStore says whether spec names the file store.
func IsFileStore(spec string) bool { return spec == "file:" || spec == "file" }

// CheckStoreSpec refuses what is neither store, naming both.
func CheckStoreSpec(spec string) error {
	if IsFileStore(spec) || pgstore.IsURL(spec) {
		return nil
	}
	shown := spec
	if len(shown) > 16 {
		shown = shown[:16] + "…"
	}
	return fmt.Errorf("--store %q: want file: (the Trace root's guard/) or a postgres:// URL", shown)
}

// OpenStore opens the guard's store: the file store under the Trace root
// ("file:"), or the PostgreSQL store at spec.
func OpenStore(ctx context.Context, root *confined.Dir, spec string) (reviewlog.Store, error) {
	if err := CheckStoreSpec(spec); err != nil {
		return nil, err
	}
	if IsFileStore(spec) {
		return filestore.New(root), nil
	}
	pg, err := pgstore.Open(ctx, spec)
	if err != nil {
		return nil, err // never a nil *pgstore.Store in a non-nil Store
	}
	return pg, nil
}

// OpenedDispatcher is a store through whose outbox opened reviews are
// notified: replicas share the store, so the outbox, not the replica that
// opened a review, decides who notifies it (once across the fleet, and
// still after that replica died). A store without one (the file store) is
// notified by the engine that opened the review.
type OpenedDispatcher interface {
	DispatchOpened(ctx context.Context, owner string, deliver func(ctx context.Context, id string) error, logger *slog.Logger)
}

// Listener is a store that says when something was written, as it happens
// (PostgreSQL's NOTIFY, from every replica). A store without one (the file
// store) is polled.
type Listener interface {
	Listen(ctx context.Context, channel string, interval time.Duration, wake func(), logger *slog.Logger)
}

// LogChanges is how to hear of each append to st's review log: a function
// that calls wake on every append (and at least every interval) until ctx
// ends, or nil when st cannot tell (poll it instead).
func LogChanges(st reviewlog.Store, interval time.Duration, logger *slog.Logger) func(ctx context.Context, wake func()) {
	l, ok := st.(Listener)
	if !ok {
		return nil
	}
	return func(ctx context.Context, wake func()) {
		l.Listen(ctx, pgstore.ChannelLog, interval, wake, logger)
	}
}
