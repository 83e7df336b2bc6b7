package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// KeepQuestion queues a decision's question for the section's commit, in
// the same transaction as its receipt (schema 10, decision_questions).
func (w *writer) KeepQuestion(ctx context.Context, receipt string, line []byte) error {
	if len(line) == 0 || len(line) > reviewlog.MaxQuestionLine {
		return fmt.Errorf("the question of receipt %s is not a line of at most %d bytes", receipt, reviewlog.MaxQuestionLine)
	}
	b := &pgx.Batch{}
	b.Queue("INSERT INTO decision_questions (receipt, line) VALUES ($1, $2)", receipt, line)
	w.queue(b)
	return nil
}

// Questions reads every kept question in the order kept.
func (r *reader) Questions(ctx context.Context, fn func(line []byte) error) error {
	rows, err := r.q.Query(ctx, "SELECT line FROM decision_questions ORDER BY id")
	if err != nil {
		return fmt.Errorf("PostgreSQL at %s: read the kept questions: %w", r.s.describe, scrub(err))
	}
	defer rows.Close()
	var line []byte
	for rows.Next() {
		if err := rows.Scan(&line); err != nil {
			return fmt.Errorf("PostgreSQL at %s: read the kept questions: %w", r.s.describe, scrub(err))
		}
		if err := fn(line); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("PostgreSQL at %s: read the kept questions: %w", r.s.describe, scrub(err))
	}
	return nil
}
