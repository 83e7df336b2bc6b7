-- An approval is used at most once, and the database says so: each `used`
-- line of the review log (or of an archive) is a row here, keyed by its
-- review, so a second use of one approval is refused at commit whatever
-- the code above did. Existing uses are moved in from the log's rows.

-- +goose Up
CREATE TABLE review_uses (
    review_id text PRIMARY KEY,
    used_at   timestamptz NOT NULL DEFAULT now()
);
INSERT INTO review_uses (review_id)
SELECT DISTINCT review_id FROM review_lines WHERE kind = 'used' AND review_id IS NOT NULL;

-- +goose Down
DROP TABLE review_uses;
