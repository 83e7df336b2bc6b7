package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
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

// TenantPlaceholder, in the database name of a PostgreSQL --store URL,
// stands for the tenant: with --tenants-dir each tenant's guard state lives
// in a database of its own (postgres://…/haia_{tenant}) on one server.
const TenantPlaceholder = "{tenant}"

// TenantStore is the store of tenant (or of a server without tenants, "")
// under spec. The file store keeps each tenant's state under its root. A
// PostgreSQL URL names one database per tenant with TenantPlaceholder in
// its database name, and only there: one database for every tenant would
// mix their review logs and chains, and a tenant could not move another's
// connection anywhere but to its own database. A URL with the placeholder
// names no store without a tenant.
func TenantStore(spec, tenant string) (string, error) {
	if IsFileStore(spec) || !pgstore.IsURL(spec) {
		return spec, nil
	}
	n := strings.Count(spec, TenantPlaceholder)
	if tenant == "" {
		if n > 0 {
			return "", fmt.Errorf("--store names a database per tenant (%s): give --tenants-dir (and --tenant NAME to a command), or the tenant's own URL", TenantPlaceholder)
		}
		return spec, nil
	}
	need := fmt.Errorf("--tenants-dir with PostgreSQL needs a database per tenant: put %s once in the --store URL's database name, as in postgres://…/haia_%s (one database would mix the tenants' review logs and chains)", TenantPlaceholder, TenantPlaceholder)
	if n != 1 {
		return "", need
	}
	// Where the placeholder is, read with a mark no URL part escapes.
	const mark = "haiatenantmark"
	if strings.Contains(spec, mark) {
		return "", need
	}
	u, err := url.Parse(strings.Replace(spec, TenantPlaceholder, mark, 1))
	if err != nil {
		return "", errors.New("--store: the PostgreSQL URL does not parse")
	}
	db := strings.TrimPrefix(u.Path, "/")
	if !strings.Contains(db, mark) || strings.Contains(db, "/") || u.RawPath != "" {
		return "", need
	}
	return strings.Replace(spec, TenantPlaceholder, tenant, 1), nil
}

// OpenStore opens the guard's store: the file store under the Trace root
// ("file:"), or the PostgreSQL store at spec.
func OpenStore(ctx context.Context, root *confined.Dir, spec string) (reviewlog.Store, error) {
	if err := CheckStoreSpec(spec); err != nil {
		return nil, err
	}
	if _, err := TenantStore(spec, ""); err != nil {
		return nil, err // a database per tenant, and no tenant named
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
