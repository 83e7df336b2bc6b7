-- What allows reserve, one row a reservation: each `reserved` line of the
-- review log is a row here, written in the same transaction as the line,
-- with the offset of that line and, once one is recorded, of the first
-- `released` line that names it. A decision reads the rows of its scopes
-- by index and then the lines they point to: a row is an index, never a
-- record — the engine verifies each line's seal, and a row that disagrees
-- with its line, or a line without its row, is a reason to review.
-- Existing reserved and released lines are moved in.

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

-- Backfill: the log's reserved lines (kind is set only for lines the log
-- reads as records), the first of each receipt, then their releases.
INSERT INTO reservations (receipt_id, tenant, caller, pay_to, host, resource, atomic, asset, at, until, open, off)
SELECT DISTINCT ON (j.r ->> 'receipt_id')
       j.r ->> 'receipt_id', COALESCE(j.r ->> 'tenant', ''), j.r ->> 'caller',
       NULLIF(j.r ->> 'pay_to', ''), NULLIF(j.r ->> 'host', ''), NULLIF(j.r ->> 'resource', ''),
       j.r ->> 'atomic', j.r ->> 'asset', (j.at)::timestamptz, (NULLIF(j.r ->> 'until', ''))::timestamptz,
       COALESCE((j.r ->> 'open')::boolean, false), j.off
FROM (SELECT off, convert_from(line, 'UTF8')::jsonb -> 'reservation' AS r,
             convert_from(line, 'UTF8')::jsonb ->> 'at' AS at
      FROM review_lines WHERE stream = 'decisions.ndjson' AND kind = 'reserved') AS j
ORDER BY j.r ->> 'receipt_id', j.off;
UPDATE reservations AS r SET release_off = (
    SELECT min(l.off) FROM review_lines AS l
    WHERE l.stream = 'decisions.ndjson' AND l.kind = 'released' AND l.off > r.off
      AND convert_from(l.line, 'UTF8')::jsonb #>> '{release,receipt_id}' = r.receipt_id);

-- +goose Down
DROP TABLE reservations;
