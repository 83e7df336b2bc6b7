package reviewlog_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// TestQuestionsOfOneScopeTakeTheirTurnInTheProcess: of one process's
// questions of one scope, only one at a time goes to the database, and the
// next names what it reads beside the log (Prefetch) only once the one
// before has committed; a question of other scopes goes at once, and one
// that waits longer than the lock wait for its turn is refused
// (ErrLockTimeout) with nothing written.
func TestQuestionsOfOneScopeTakeTheirTurnInTheProcess(t *testing.T) {
	_, st, _ := indexedStore(t)
	l := reviewlog.OpenStore(st, reviewlog.Options{Parallel: 4, LockWait: 2 * time.Second})
	ctx := t.Context()
	plain := func(*reviewlog.AskView) (reviewlog.AskPlan, error) {
		return reviewlog.AskPlan{Kind: reviewlog.AskPlain}, nil
	}
	ask := func(ctx context.Context, caller, payee string, prefetched *atomic.Int32, decide func(*reviewlog.AskView) (reviewlog.AskPlan, error)) error {
		_, err := l.Ask(ctx, reviewlog.AskRequest{
			Caller:   caller,
			Question: guard.Question{Counterparty: payee, Amount: "1.00"},
			Prefetch: func() *reviewlog.Prefetch {
				prefetched.Add(1)
				return nil
			},
		}, decide, func(reviewlog.Tx, reviewlog.AskOutcome) error { return nil })
		return err
	}
	const payee, other = "0x00000000000000000000000000000000000000aa", "0x00000000000000000000000000000000000000bb"

	// holdPayee asks a question of "first" that holds the payee until
	// the function it returns is called (at the latest when the test
	// ends, so that a failure leaves nothing holding it).
	first := make(chan error, 1)
	var firstPre atomic.Int32
	holdPayee := func() (release func()) {
		inside, out := make(chan struct{}), make(chan struct{})
		var once sync.Once
		release = func() { once.Do(func() { close(out) }) }
		t.Cleanup(release)
		go func() {
			first <- ask(ctx, "first", payee, &firstPre, func(*reviewlog.AskView) (reviewlog.AskPlan, error) {
				close(inside)
				<-out
				return reviewlog.AskPlan{Kind: reviewlog.AskPlain}, nil
			})
		}()
		<-inside
		return release
	}
	release := holdPayee()

	// Another payee: not held, answered at once.
	var otherPre atomic.Int32
	if err := ask(ctx, "third", other, &otherPre, plain); err != nil || otherPre.Load() != 1 {
		t.Fatalf("a question of another scope: %v (prefetched %d times)", err, otherPre.Load())
	}

	// The same payee: waits in the process, its Prefetch not yet asked.
	second := make(chan error, 1)
	var secondPre atomic.Int32
	go func() { second <- ask(ctx, "second", payee, &secondPre, plain) }()
	time.Sleep(300 * time.Millisecond)
	if n := secondPre.Load(); n != 0 {
		t.Fatalf("the second question of the payee named what it reads (%d) while the first held the payee", n)
	}
	select {
	case err := <-second:
		t.Fatalf("the second question of the payee was answered while the first held it: %v", err)
	default:
	}
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if n := secondPre.Load(); n != 1 {
		t.Fatalf("the second question's Prefetch ran %d times, want 1", n)
	}

	// A turn never given back within the lock wait: refused, not answered.
	release = holdPayee()
	var late atomic.Int32
	start := time.Now()
	err := ask(ctx, "second", payee, &late, plain)
	if !errors.Is(err, reviewlog.ErrLockTimeout) || late.Load() != 0 {
		t.Fatalf("waiting past the lock wait: %v (prefetched %d times), want ErrLockTimeout", err, late.Load())
	}
	if d := time.Since(start); d < time.Second {
		t.Fatalf("refused after %s, before the lock wait", d)
	}
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// And the turn is free again.
	if err := ask(ctx, "second", payee, &late, plain); err != nil {
		t.Fatal(err)
	}
}
