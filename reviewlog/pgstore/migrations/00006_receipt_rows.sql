-- The decision chains' receipts indexed in rows: one row of receipt_rows a
-- receipt line of a segment, written by the statement that appends the
-- line (pgstore/receipts.go), so that a decision finds the receipts it
-- reads by index instead of reading every receipt the fleet appended. A
-- row is an index, never a record: a reader parses the line it points to,
-- checks the row against it, and verifies signatures as before.
--
-- rcount numbers the receipts that reserve a payment (a SERVICE ALLOWED
-- answer to a question: reserves 'allow', or 'hold' for an authorization)
-- within their segment: each row carries how many such receipts its
-- segment holds up to and including its line. A decision reads the
-- reserving rows of its window and checks that their numbers run without
-- a gap up to the count the segment's last line carries, so a reserving
-- row deleted or edited out of the window is seen.

-- +goose Up
CREATE TABLE receipt_rows (
    stream      text   NOT NULL,
    off         bigint NOT NULL CHECK (off >= 0),
    seq         bigint NOT NULL,
    receipt_id  text   NOT NULL,
    action_id   text   NOT NULL,
    agent_id    text   NOT NULL,
    principal   text   NOT NULL,
    verdict     text   NOT NULL,
    rule_id     text,
    params_hash text   NOT NULL,
    canonical   text   NOT NULL,
    ts          timestamptz,
    -- The passkey credential a HUMAN receipt's agent.model carries.
    credential  text,
    -- 'allow', 'hold' or NULL (reserves nothing).
    reserves    text CHECK (reserves IN ('allow', 'hold')),
    rcount      bigint NOT NULL CHECK (rcount >= 0),
    PRIMARY KEY (stream, off)
);
CREATE INDEX receipt_rows_action ON receipt_rows (action_id) WHERE starts_with(action_id, 'review:');
CREATE INDEX receipt_rows_question ON receipt_rows (agent_id, params_hash)
    WHERE principal = 'SERVICE' AND verdict = 'DEFERRED' AND starts_with(action_id, 'review:');
CREATE UNIQUE INDEX receipt_rows_reserving ON receipt_rows (stream, rcount) WHERE reserves IS NOT NULL;
CREATE INDEX receipt_rows_reserving_id ON receipt_rows (receipt_id) WHERE reserves IS NOT NULL;
CREATE INDEX receipt_rows_holds ON receipt_rows (stream) WHERE reserves = 'hold';
CREATE INDEX receipt_rows_credential ON receipt_rows (credential) WHERE credential IS NOT NULL;

-- The credential id inside a passkey assertion (agent.model
-- "webauthn-assertion:<base64url JSON>"); NULL when it cannot be read.
-- +goose StatementBegin
CREATE FUNCTION pg_temp.haia_credential(model text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    s text;
BEGIN
    IF model IS NULL OR NOT starts_with(model, 'webauthn-assertion:') THEN
        RETURN NULL;
    END IF;
    s := translate(substr(model, 20), '-_', '+/');
    s := s || repeat('=', (4 - length(s) % 4) % 4);
    RETURN convert_from(decode(s, 'base64'), 'UTF8')::jsonb ->> 'credential_id';
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- Every receipt already stored, read as jsonb (as pgstore/receipts.go
-- reads it in Go; a test holds the two to each other).
INSERT INTO receipt_rows (stream, off, seq, receipt_id, action_id, agent_id, principal, verdict, rule_id, params_hash, canonical, ts, credential, reserves, rcount)
SELECT stream, off, seq, rid, aid, agent, principal, verdict, rule, ph, canonical, ts,
    CASE WHEN principal = 'HUMAN' THEN pg_temp.haia_credential(model) END,
    reserves,
    count(reserves) OVER (PARTITION BY stream ORDER BY off)
FROM (
    SELECT stream, off, seq,
        coalesce(j->>'id', '') AS rid,
        coalesce(j#>>'{action,id}', '') AS aid,
        coalesce(j#>>'{agent,id}', '') AS agent,
        coalesce(j#>>'{agent,principal}', '') AS principal,
        coalesce(j#>>'{governance,verdict}', '') AS verdict,
        j#>>'{governance,ruleId}' AS rule,
        coalesce(j#>>'{action,paramsHash}', '') AS ph,
        coalesce(j#>>'{action,canonical}', '') AS canonical,
        (j->>'ts')::timestamptz AS ts,
        j#>>'{agent,model}' AS model,
        CASE WHEN j#>>'{agent,principal}' = 'SERVICE' AND j#>>'{governance,verdict}' = 'ALLOWED'
                AND j#>>'{agent,id}' <> 'haia-trace-mcp' AND j->>'ts' IS NOT NULL
            THEN CASE j#>>'{action,canonical}' WHEN 'x402.payment' THEN 'allow' WHEN 'x402.authorization' THEN 'hold' END
        END AS reserves
    FROM (SELECT stream, off, seq, convert_from(line, 'UTF8')::jsonb AS j FROM receipts) AS r
) AS x;

-- Every receipt commits with its row: a binary older than this schema
-- (which writes receipts alone) has its decision refused at commit.
-- +goose StatementBegin
CREATE FUNCTION haia_receipt_row_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM receipt_rows WHERE stream = NEW.stream AND off = NEW.off) THEN
        RAISE EXCEPTION 'the receipt at byte % of % is appended without its row in receipt_rows (a binary older than schema 6 wrote it?)', NEW.off, NEW.stream;
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE CONSTRAINT TRIGGER receipt_row_written AFTER INSERT ON receipts DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION haia_receipt_row_written();

-- A row is written once, with its receipt, and never changed or removed
-- (receipts never move): an edit needs the table owner to drop or disable
-- this trigger first.
-- +goose StatementBegin
CREATE FUNCTION haia_receipt_rows_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'receipt_rows are written once with their receipts and never changed (% refused)', TG_OP;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER receipt_rows_fixed BEFORE UPDATE OR DELETE OR TRUNCATE ON receipt_rows
    FOR EACH STATEMENT EXECUTE FUNCTION haia_receipt_rows_fixed();

-- +goose Down
DROP TRIGGER receipt_row_written ON receipts;
DROP FUNCTION haia_receipt_row_written();
DROP TABLE receipt_rows;
DROP FUNCTION haia_receipt_rows_fixed();
