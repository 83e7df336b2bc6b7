package reviewlog

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// scopeGate is a process's turn at each scope it holds alone: the lanes of
// one Log (Options.Parallel) take their questions' scopes here, in lock
// order, before the store's locks, so that of a process's questions of one
// scope only one at a time waits in the database for it.
//
// The store's locks decide; the gate only queues. What it buys: a question
// reads what changed since its process last read (Prefetch) as of the
// moment it passes the gate, not the moment it was asked, so a question
// that waited behind the process's own questions of its scope does not
// read again everything they read and wrote; and on a scope every replica
// asks of, each replica has one backend, not Parallel, waiting on the
// database's lock and woken in turn.
//
// Deadlock-free beside the store's locks: a section takes its gates in
// lock order, all of them before any database lock, and keeps them until
// its transaction ends; a section that holds a scope in the database holds
// its gate in its process too, so a wait at a gate is for a section that
// either waits at a later gate or is past every gate, and a wait in the
// database is as before.
type scopeGate struct {
	mu    sync.Mutex
	turns map[int64]*gateTurn
}

// gateTurn is one scope's turn: a slot taken by the section that holds it
// and the sections that want it (refs), dropped when none does.
type gateTurn struct {
	slot chan struct{}
	refs int
}

func newScopeGate() *scopeGate { return &scopeGate{turns: map[int64]*gateTurn{}} }

// enter takes, in order, the turn of every scope of order held alone
// (shared scopes do not wait for each other, and one held alone waits for
// the shared holders in the database), waiting until deadline at most. It
// returns the function that gives them back.
func (g *scopeGate) enter(ctx context.Context, order []Scope, deadline time.Time, what string, wait time.Duration) (func(), error) {
	var held []int64
	release := func() {
		for _, k := range held {
			g.leave(k)
		}
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for _, sc := range order {
		if sc.Shared {
			continue
		}
		k := sc.LockKey()
		g.mu.Lock()
		t := g.turns[k]
		if t == nil {
			t = &gateTurn{slot: make(chan struct{}, 1)}
			g.turns[k] = t
		}
		t.refs++
		g.mu.Unlock()
		select {
		case t.slot <- struct{}{}:
			held = append(held, k)
			continue
		default:
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		select {
		case t.slot <- struct{}{}:
			held = append(held, k)
		case <-ctx.Done():
			g.drop(k)
			release()
			return nil, ctx.Err()
		case <-timer.C:
			g.drop(k)
			release()
			return nil, fmt.Errorf("%s: %w within %s (another question of this process holds its %s scope)", what, ErrLockTimeout, wait, sc.Kind)
		}
	}
	return release, nil
}

// leave gives back the turn of key k.
func (g *scopeGate) leave(k int64) {
	g.mu.Lock()
	t := g.turns[k]
	g.mu.Unlock()
	<-t.slot
	g.drop(k)
}

// drop forgets one section's interest in key k.
func (g *scopeGate) drop(k int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.turns[k]
	if t.refs--; t.refs == 0 {
		delete(g.turns, k)
	}
}
