-- What allows reserve, one row a reservation: each `reserved` line of the
-- review log is a row here, written in the same transaction as the line,
-- with the offset of that line and, once one is recorded, of the first
-- `released` line that names it. A decision reads the rows of its scopes
-- by index and then the lines they point to: a row is an index, never a
-- record — the engine verifies each line's seal, and a row that disagrees
-- with its line, or a line without its row, is a reason to review.

-- +goose Up
CREATE TABLE reservations (
    receipt_id  text PRIMARY KEY,
    -- The tenant the record names ('' for a record that names none: the
    -- store's own tenant's).
    tenant      text    NOT NULL,
    caller      text    NOT NULL,
    pay_to      text,
    host        text,
    resource    text,
    atomic      text    NOT NULL,
    asset       text    NOT NULL,
    at          timestamptz NOT NULL,
    -- NULL: a hold (an authorization), until the Trace shows the payment.
    until       timestamptz,
    open        boolean NOT NULL,
    -- The offsets in the review log of the reserved line and of its
    -- release (NULL until one is recorded).
    off         bigint  NOT NULL CHECK (off >= 0),
    release_off bigint  CHECK (release_off >= 0)
);
-- The scopes a decision reads: the caller, the counterparty (a payee
-- address or a host, compared without case as the scope locks are), the
-- resource, and the tenant's totals by time (holds have no end).
CREATE INDEX reservations_caller ON reservations (tenant, caller);
CREATE INDEX reservations_pay_to ON reservations (tenant, lower(pay_to)) WHERE pay_to IS NOT NULL;
CREATE INDEX reservations_host ON reservations (tenant, lower(host)) WHERE host IS NOT NULL;
CREATE INDEX reservations_resource ON reservations (tenant, lower(resource)) WHERE resource IS NOT NULL;
CREATE INDEX reservations_until ON reservations (tenant, until);
CREATE INDEX reservations_holds ON reservations (tenant) WHERE until IS NULL;

-- The reservations and releases the log already holds are moved in by
-- `store migrate` once its migrations are applied, and again on every run
-- (pgstore's reindexSQL): one statement for this migration and for the
-- lines a replica of the previous release writes after it.

-- +goose Down
DROP TABLE reservations;
