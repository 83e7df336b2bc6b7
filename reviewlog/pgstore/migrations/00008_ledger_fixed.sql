-- Schema 8: the spend ledger's rows are fixed once written, and a receipt
-- that commits a payment commits only with its ledger entry.
-- receipt is the receipt an entry names (an index written with the row;
-- the sealed line stays the record readers verify).

-- +goose Up
ALTER TABLE ledger_entries ADD COLUMN receipt text;
CREATE INDEX ledger_entries_receipt ON ledger_entries (receipt);

-- An entry is written once and never changed or removed: an edit needs
-- the table's owner to drop or disable this trigger first (and the next
-- reader sees the edit anyway; see docs/store.md).
-- +goose StatementBegin
CREATE FUNCTION haia_ledger_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger_entries are written once and never changed (% refused)', TG_OP;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER ledger_entries_fixed BEFORE UPDATE OR DELETE OR TRUNCATE ON ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION haia_ledger_fixed();

-- A receipt that commits a payment (reserves 'allow' or 'hold') commits
-- only with its ledger entry: a binary whose allows write no entry has
-- them refused at commit instead of leaving a commitment the ledger does
-- not count. A copy (store import) of receipts signed before the ledger
-- sets haia.copy for its transaction.
-- +goose StatementBegin
CREATE FUNCTION haia_commitment_in_ledger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.reserves IS NOT NULL AND coalesce(current_setting('haia.copy', true), '') <> 'on'
        AND NOT EXISTS (SELECT 1 FROM ledger_entries WHERE receipt = NEW.receipt_id) THEN
        RAISE EXCEPTION 'receipt % commits a payment without its entry in the spend ledger', NEW.receipt_id;
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE CONSTRAINT TRIGGER commitment_in_ledger AFTER INSERT ON receipt_rows DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION haia_commitment_in_ledger();

-- +goose Down
DROP TRIGGER commitment_in_ledger ON receipt_rows;
DROP FUNCTION haia_commitment_in_ledger();
DROP TRIGGER ledger_entries_fixed ON ledger_entries;
DROP FUNCTION haia_ledger_fixed();
DROP INDEX ledger_entries_receipt;
ALTER TABLE ledger_entries DROP COLUMN receipt;
