-- The review state in rows: one row a review, written in the transaction
-- that appends its lines, and the rule the database keeps whatever the
-- code above it does: at most one open review of one question on the same
-- terms (reviews_one_open). The rows are an index of the signed lines,
-- never a record of their own: a reader checks them against the lines and
-- the signatures.
--
-- Existing reviews become rows. A log written under the older rule may
-- hold two or more open reviews of one question (a second was opened
-- after ten minutes): the newest stays the open one ('pending') and the
-- older become 'superseded' in the rows only — their lines are untouched,
-- a reviewer may still decide them, and they still count as the caller's
-- pending reviews until decided or expired.

-- +goose Up
CREATE TABLE reviews (
    review_id      text PRIMARY KEY,
    tenant         text NOT NULL DEFAULT '',
    caller         text NOT NULL,
    -- reviewlog.QuestionKey and reviewlog.TermsKey, hex (terms_key is
    -- NULL for a review opened without terms: it never conflicts).
    question_key   text NOT NULL,
    terms_key      text,
    status         text NOT NULL CHECK (status IN ('pending', 'superseded', 'expired', 'approved', 'rejected')),
    created_at     timestamptz NOT NULL,
    decided_at     timestamptz,
    used_at        timestamptz,
    -- Where the review's lines are: (stream, byte offset) in review_lines.
    opened_stream  text   NOT NULL,
    opened_off     bigint NOT NULL CHECK (opened_off >= 0),
    decided_stream text,
    decided_off    bigint CHECK (decided_off >= 0),
    used_stream    text,
    used_off       bigint CHECK (used_off >= 0),
    CHECK ((decided_at IS NULL) = (status IN ('pending', 'superseded', 'expired')))
);
CREATE UNIQUE INDEX reviews_one_open ON reviews (question_key, terms_key) WHERE status = 'pending';
CREATE INDEX reviews_question ON reviews (question_key);
CREATE INDEX reviews_caller_undecided ON reviews (caller) WHERE decided_at IS NULL;

-- The keys, as reviewlog computes them: each member as "<bytes>:<text>;".
CREATE FUNCTION pg_temp.haia_lp(s text) RETURNS text LANGUAGE sql IMMUTABLE
    AS $$ SELECT octet_length(coalesce(s, ''))::text || ':' || coalesce(s, '') || ';' $$;

-- The first opened line of each review (archives sort before the log).
INSERT INTO reviews (review_id, tenant, caller, question_key, terms_key, status, created_at, opened_stream, opened_off)
SELECT review_id,
    coalesce(j->'terms'->>'tenant', ''),
    coalesce(j->>'caller', ''),
    encode(substring(sha256(convert_to(
        pg_temp.haia_lp(j->>'caller') || pg_temp.haia_lp(j->>'counterparty') || pg_temp.haia_lp(j->>'amount') ||
        pg_temp.haia_lp(j->>'asset') || pg_temp.haia_lp(j->>'template') || pg_temp.haia_lp(j->'terms'->>'resource') ||
        CASE WHEN coalesce(j->>'pay_to', '') <> '' THEN 'pay_to:' || pg_temp.haia_lp(j->>'pay_to') ELSE '' END,
        'UTF8')) FROM 1 FOR 16), 'hex'),
    CASE WHEN jsonb_typeof(j->'terms') = 'object' THEN encode(substring(sha256(convert_to(
        pg_temp.haia_lp(j->'terms'->>'caller') || pg_temp.haia_lp(j->'terms'->>'tenant') || pg_temp.haia_lp(j->'terms'->>'counterparty') ||
        pg_temp.haia_lp(j->'terms'->>'amount') || pg_temp.haia_lp(j->'terms'->>'amount_atomic') || pg_temp.haia_lp(j->'terms'->>'asset') ||
        pg_temp.haia_lp(j->'terms'->>'resource') || pg_temp.haia_lp(j->'terms'->>'template') || pg_temp.haia_lp(j->'terms'->>'params_hash') ||
        'rules:' || jsonb_array_length(j->'terms'->'rules')::text || ';' ||
        coalesce((SELECT string_agg(pg_temp.haia_lp(x.r), '' ORDER BY x.n) FROM jsonb_array_elements_text(j->'terms'->'rules') WITH ORDINALITY AS x (r, n)), ''),
        'UTF8')) FROM 1 FOR 16), 'hex') END,
    CASE WHEN jsonb_typeof(j->'terms') = 'object' THEN 'superseded' ELSE 'pending' END,
    (j->>'at')::timestamptz, stream, off
FROM (SELECT DISTINCT ON (review_id) review_id, stream, off, convert_from(line, 'UTF8')::jsonb AS j
      FROM review_lines WHERE kind = 'opened' AND review_id IS NOT NULL ORDER BY review_id, stream, off) AS o;

-- The first decision and the first use of each.
UPDATE reviews r SET status = d.j->>'status', decided_at = (d.j->>'at')::timestamptz, decided_stream = d.stream, decided_off = d.off
FROM (SELECT DISTINCT ON (review_id) review_id, stream, off, convert_from(line, 'UTF8')::jsonb AS j
      FROM review_lines WHERE kind = 'decided' AND review_id IS NOT NULL ORDER BY review_id, stream, off) AS d
WHERE r.review_id = d.review_id;
UPDATE reviews r SET used_at = (u.j->>'at')::timestamptz, used_stream = u.stream, used_off = u.off
FROM (SELECT DISTINCT ON (review_id) review_id, stream, off, convert_from(line, 'UTF8')::jsonb AS j
      FROM review_lines WHERE kind = 'used' AND review_id IS NOT NULL ORDER BY review_id, stream, off) AS u
WHERE r.review_id = u.review_id;

-- The newest undecided review of each question and terms is the open one
-- (the same two statements settle a store import: pgstore/rows.go).
UPDATE reviews r SET status = 'superseded' FROM (
    SELECT review_id, row_number() OVER (PARTITION BY question_key, terms_key ORDER BY created_at DESC, opened_stream DESC, opened_off DESC) AS n
    FROM reviews WHERE status IN ('pending', 'superseded') AND terms_key IS NOT NULL) AS k
WHERE r.review_id = k.review_id AND k.n > 1 AND r.status = 'pending';
UPDATE reviews r SET status = 'pending' FROM (
    SELECT review_id, row_number() OVER (PARTITION BY question_key, terms_key ORDER BY created_at DESC, opened_stream DESC, opened_off DESC) AS n
    FROM reviews WHERE status IN ('pending', 'superseded') AND terms_key IS NOT NULL) AS k
WHERE r.review_id = k.review_id AND k.n = 1 AND r.status = 'superseded';

-- Every line that opens, decides or uses a review commits with its row
-- written: a binary older than this schema (which writes lines alone) has
-- its decision refused at commit instead of leaving a review the rows do
-- not know. A line the log cannot read (kind NULL) is the fold's to report.
-- +goose StatementBegin
CREATE FUNCTION haia_review_row_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind = 'opened' AND NOT EXISTS (SELECT 1 FROM reviews WHERE review_id = NEW.review_id) THEN
        RAISE EXCEPTION 'review % is opened in the log without its row in reviews (a binary older than schema 3 wrote it?)', NEW.review_id;
    END IF;
    IF NEW.kind = 'decided' AND EXISTS (SELECT 1 FROM reviews WHERE review_id = NEW.review_id AND decided_off IS NULL) THEN
        RAISE EXCEPTION 'review % is decided in the log but not in its row in reviews (a binary older than schema 3 wrote it?)', NEW.review_id;
    END IF;
    IF NEW.kind = 'used' AND EXISTS (SELECT 1 FROM reviews WHERE review_id = NEW.review_id AND used_off IS NULL) THEN
        RAISE EXCEPTION 'the approval of review % is used in the log but not in its row in reviews (a binary older than schema 3 wrote it?)', NEW.review_id;
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE CONSTRAINT TRIGGER review_row_written AFTER INSERT ON review_lines DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.kind IN ('opened', 'decided', 'used')) EXECUTE FUNCTION haia_review_row_written();

-- +goose Down
DROP TRIGGER review_row_written ON review_lines;
DROP FUNCTION haia_review_row_written();
DROP TABLE reviews;
