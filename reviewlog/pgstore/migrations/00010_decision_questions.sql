-- Schema 10 only adds a table: each decision's question (the arguments of
-- check_before_pay, authorize_payment or a proxied call), kept beside its
-- signed receipt so that `policy simulate` can replay it under another
-- policy. The line is what the guard wrote, sealed with the server's key
-- and bound to the receipt's paramsHash; a reader verifies both, so a row
-- edited or moved is not replayed. Rows are written once, in the
-- decision's transaction, and never changed. Nothing else changes, and
-- nothing is moved: decisions made before have no question.

-- +goose Up
CREATE TABLE decision_questions (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    receipt text  NOT NULL UNIQUE,
    line    bytea NOT NULL CHECK (length(line) > 0 AND length(line) <= 65536)
);

-- +goose StatementBegin
CREATE FUNCTION haia_questions_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'decision_questions are written once and never changed (% refused)', TG_OP;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER decision_questions_fixed BEFORE UPDATE OR DELETE OR TRUNCATE ON decision_questions
    FOR EACH STATEMENT EXECUTE FUNCTION haia_questions_fixed();

-- +goose Down
DROP TRIGGER decision_questions_fixed ON decision_questions;
DROP FUNCTION haia_questions_fixed();
DROP TABLE decision_questions;
