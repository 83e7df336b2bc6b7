-- The spend ledger (package ledger): one row an entry, the exact line the
-- server sealed, by lane and seq. Each lane is a chain of its own (each
-- entry names the hash of the one before it), appended by the one
-- decision that holds the lane until it commits. The rows are the record;
-- every reader verifies each line's seal and link, so a row edited,
-- deleted, moved or replayed is seen by the next reader.

-- +goose Up
CREATE TABLE ledger_entries (
    lane int    NOT NULL CHECK (lane >= 0 AND lane < 16),
    seq  bigint NOT NULL CHECK (seq >= 0),
    line bytea  NOT NULL CHECK (length(line) > 0),
    PRIMARY KEY (lane, seq)
);

-- +goose Down
DROP TABLE ledger_entries;
