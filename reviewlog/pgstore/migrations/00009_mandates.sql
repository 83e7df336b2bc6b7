-- Schema 9: the mandate records (package mandate): standing approvals a
-- reviewer signed, the further signatures a quorum asks for, their
-- revocations. One row a record, the exact line the reviewer signed, in
-- order; each names the hash of the one before it, and every reader
-- verifies each signature and link, so a row added, edited, removed or
-- reordered is seen. Rows are written once and never changed.

-- +goose Up
CREATE TABLE mandate_records (
    seq  bigint NOT NULL PRIMARY KEY CHECK (seq >= 0),
    line bytea  NOT NULL CHECK (length(line) > 0)
);

-- +goose StatementBegin
CREATE FUNCTION haia_mandates_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'mandate_records are written once and never changed (% refused)', TG_OP;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER mandate_records_fixed BEFORE UPDATE OR DELETE OR TRUNCATE ON mandate_records
    FOR EACH STATEMENT EXECUTE FUNCTION haia_mandates_fixed();

-- +goose Down
DROP TRIGGER mandate_records_fixed ON mandate_records;
DROP FUNCTION haia_mandates_fixed();
DROP TABLE mandate_records;
