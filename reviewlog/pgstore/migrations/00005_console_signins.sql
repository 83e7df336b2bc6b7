-- This migration only adds a table: the reviewer console's used sign-in
-- challenges, one row each (the SHA-256 of the challenge), so that one
-- passkey assertion signs in once on whichever replica it reaches — the
-- primary key refuses a second use at commit. A row is kept until its
-- challenge has long expired; the console removes such rows as it signs
-- reviewers in. Nothing else in the schema changes, and nothing is moved.

-- +goose Up
CREATE TABLE console_signins (
    challenge  bytea PRIMARY KEY CHECK (length(challenge) = 32),
    expires_at timestamptz NOT NULL
);
CREATE INDEX console_signins_expires ON console_signins (expires_at);

-- +goose Down
DROP TABLE console_signins;
