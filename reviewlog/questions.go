package reviewlog

import "context"

// QuestionsFile is where the file store keeps the questions of its
// decisions, under guard/: one line a decision, beside its receipt.
const QuestionsFile = "questions.ndjson"

// MaxQuestionLine bounds one kept question's line; a longer line is not
// kept (the decision stands, its question is then not replayable).
const MaxQuestionLine = 64 << 10

// QuestionKeeper is a Writer that keeps each decision's question beside
// its signed receipt, in the decision's commit (guard/engine writes the
// line, sealed and bound to the receipt's paramsHash; the store keeps its
// bytes). Both stores implement it.
type QuestionKeeper interface {
	KeepQuestion(ctx context.Context, receipt string, line []byte) error
}

// QuestionSource is a Reader that reads the kept questions: every line,
// in the order kept (fn is called once a line; an error stops the walk).
type QuestionSource interface {
	Questions(ctx context.Context, fn func(line []byte) error) error
}
