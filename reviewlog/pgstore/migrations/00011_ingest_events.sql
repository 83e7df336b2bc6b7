-- Schema 11: the events recorders post to --ingest (package ingest), so
-- that replicas on separate hosts need no shared volume. One row an
-- event: the tenant's run it belongs to, its event_id (unique within the
-- run: a retried batch stores nothing twice) and the exact Event Contract
-- line the run file gets. id orders a tenant's events as they were
-- committed (inserts of one tenant hold a transaction lock), which is
-- the order each replica appends them to its own copy of the run files.
-- Rows are written once and never changed.

-- +goose Up
CREATE TABLE ingest_events (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant   text   NOT NULL,
    run_id   text   NOT NULL CHECK (length(run_id) BETWEEN 1 AND 128),
    event_id text   NOT NULL CHECK (length(event_id) > 0),
    line     text   NOT NULL CHECK (length(line) > 0),
    UNIQUE (tenant, run_id, event_id)
);
CREATE INDEX ingest_events_tenant_id ON ingest_events (tenant, id);

-- +goose StatementBegin
CREATE FUNCTION haia_ingest_events_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ingest_events are written once and never changed (% refused)', TG_OP;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER ingest_events_fixed BEFORE UPDATE OR DELETE OR TRUNCATE ON ingest_events
    FOR EACH STATEMENT EXECUTE FUNCTION haia_ingest_events_fixed();

-- +goose Down
DROP TRIGGER ingest_events_fixed ON ingest_events;
DROP FUNCTION haia_ingest_events_fixed();
DROP TABLE ingest_events;
