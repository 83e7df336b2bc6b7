package proxy

import (
	"context"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
)

// A task's work ends when its task is cancelled, whichever of the handler
// and the after-call hook comes first, and not when the request that
// created it ends; the links are forgotten once both ends are done.
func TestTaskLinks(t *testing.T) {
	for _, c := range []struct {
		name                     string
		hookFirst, cancel, early bool
	}{
		{"handler first, cancelled", false, true, false},
		{"hook first, cancelled", true, true, false},
		{"cancelled before the handler started", true, true, true},
		{"not cancelled", false, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &Proxy{}
			tp := &mcp.TaskParams{}
			req, endRequest := context.WithCancel(context.Background())
			var ctx context.Context
			var done func()
			if c.hookFirst {
				p.taskCreated(tp, "task-1")
			}
			if c.early {
				p.taskCancelled("task-1")
			}
			ctx, done = p.taskContext(req, tp)
			if !c.hookFirst {
				p.taskCreated(tp, "task-1")
			}
			endRequest()
			if ctx.Err() != nil && !c.early {
				t.Fatal("the task's work ended with its request")
			}
			if c.cancel && !c.early {
				p.taskCancelled("task-1")
			}
			if (ctx.Err() != nil) != c.cancel {
				t.Fatalf("cancelled %v, want %v", ctx.Err() != nil, c.cancel)
			}
			p.taskCancelled("another task") // names nothing of this one
			done()
			if len(p.tasks.byParams) != 0 || len(p.tasks.byID) != 0 {
				t.Fatalf("links left: %v %v", p.tasks.byParams, p.tasks.byID)
			}
		})
	}
	// The hook that comes after a fast handler finished leaves nothing.
	p := &Proxy{}
	tp := &mcp.TaskParams{}
	_, done := p.taskContext(context.Background(), tp)
	done()
	p.taskCreated(tp, "fast")
	if len(p.tasks.byParams) != 0 || len(p.tasks.byID) != 0 {
		t.Fatalf("links left after a fast task: %v %v", p.tasks.byParams, p.tasks.byID)
	}
}
