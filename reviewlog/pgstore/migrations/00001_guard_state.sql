-- The guard's state: the review log and the decision chains as the exact
-- lines that were written (each row one line, newline included, at its byte
-- offset in the stream), the public keys that signed, and the outbox of
-- opened reviews to notify.

-- +goose Up
CREATE TABLE guard_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO guard_meta (key, value) VALUES ('generation', gen_random_uuid()::text);

-- One row a stream: the review log, its archives and every chain segment.
-- size is the stream's length in bytes; generation changes when the stream
-- is rewritten (an archive run), so cached readers start over.
CREATE TABLE guard_streams (
    name       text PRIMARY KEY,
    size       bigint NOT NULL CHECK (size >= 0),
    generation text NOT NULL
);

-- The review log (stream 'decisions.ndjson') and its archives.
CREATE TABLE review_lines (
    stream    text   NOT NULL REFERENCES guard_streams (name),
    off       bigint NOT NULL CHECK (off >= 0),
    line      bytea  NOT NULL CHECK (length(line) > 0),
    kind      text,
    review_id text,
    at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream, off)
);
CREATE INDEX review_lines_review ON review_lines (review_id);

-- Chain segments ('receipts/<segment>.ndjson'): one row a signed receipt.
-- A sequence number is used once per segment, which keeps a chain linear
-- even if two writers ever held the head at once.
CREATE TABLE receipts (
    stream    text   NOT NULL REFERENCES guard_streams (name),
    off       bigint NOT NULL CHECK (off >= 0),
    seq       bigint NOT NULL,
    action_id text   NOT NULL,
    verdict   text   NOT NULL,
    line      bytea  NOT NULL CHECK (length(line) > 0),
    PRIMARY KEY (stream, off),
    UNIQUE (stream, seq)
);
CREATE INDEX receipts_action ON receipts (action_id);

CREATE TABLE keyring (
    kid  text PRIMARY KEY,
    spki text NOT NULL
);

-- Each opened review is delivered to the notifier once across the fleet:
-- a replica claims it (FOR UPDATE SKIP LOCKED), delivers, marks it.
CREATE TABLE notify_outbox (
    review_id    text PRIMARY KEY,
    opened_at    timestamptz NOT NULL DEFAULT now(),
    claimed_by   text,
    claimed_at   timestamptz,
    delivered_at timestamptz
);
CREATE INDEX notify_outbox_due ON notify_outbox (opened_at) WHERE delivered_at IS NULL;

-- +goose Down
DROP TABLE notify_outbox;
DROP TABLE keyring;
DROP TABLE receipts;
DROP TABLE review_lines;
DROP TABLE guard_streams;
DROP TABLE guard_meta;
