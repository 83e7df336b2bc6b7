package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
)

// Tasks: a host that calls an upstream tool as a task (tools/call with
// "task") gets a task of the proxy's own server at once, and tasks/get,
// tasks/result, tasks/list and tasks/cancel are the proxy's. The task runs
// the tool's handler: an unmapped tool is forwarded, a paying tool is first
// one engine question — the upstream's task is created only after an
// allow. The forwarded call asks the upstream to run it as its own task
// and waits for that task's result (tasks/result), which becomes the
// proxy's task's result and the paying call's outcome; cancelling the
// proxy's task cancels the upstream's.

// callTask forwards a call as a task of the upstream and waits for its
// result: as long as the call timeout, or the task's requested TTL when
// that is longer.
func (p *Proxy) callTask(ctx context.Context, name string, args []byte, meta *mcp.Meta, task *mcp.TaskParams) (*mcp.CallToolResult, engine.Outcome, error) {
	wait := p.cfg.CallTimeout
	if task.TTL != nil && time.Duration(*task.TTL)*time.Millisecond > wait {
		wait = time.Duration(*task.TTL) * time.Millisecond
	}
	cctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	params := map[string]any{"name": name, "arguments": json.RawMessage(args), "task": task}
	if meta != nil {
		params["_meta"] = meta
	}
	raw, err := p.up.Request(cctx, string(mcp.MethodToolsCall), params)
	if err != nil {
		return nil, failure(ctx, cctx, err), err
	}
	// The answer was read exactly on its way in (exact.go): no member
	// twice, none of those read here in another case.
	var created struct {
		Task *mcp.Task `json:"task"`
	}
	if err := json.Unmarshal(raw, &created); err != nil {
		return nil, engine.OutcomeLost, fmt.Errorf("the upstream's answer to a task call cannot be read: %w", err)
	}
	if created.Task == nil {
		// The upstream ran the call at once: its answer is the result.
		return toolResult(raw)
	}
	id := created.Task.TaskId
	if id == "" {
		return nil, engine.OutcomeLost, errors.New("the upstream created a task without an id")
	}
	p.cfg.Logger.Debug("upstream task created", "tool", name, "upstream_task", id)
	raw, err = p.up.Request(cctx, string(mcp.MethodTasksResult), map[string]any{"taskId": id})
	if err == nil {
		return toolResult(raw)
	}
	var ue *UpstreamError
	switch {
	case ctx.Err() != nil:
		// The host cancelled the proxy's task: the upstream's is cancelled
		// too; whether it paid before is unknown.
		p.cancelUpstreamTask(id)
		return nil, engine.OutcomeLost, fmt.Errorf("the task was cancelled: %w", ctx.Err())
	case errors.As(err, &ue) && !errors.Is(err, ErrNotSent):
		// The task was created, so its tool ran or may have: no error
		// answer to tasks/result proves it did not, whatever its code. A
		// task that failed is the tool's failure — a tool may fail after
		// it paid, so it releases only where the guard map says the tool's
		// errors mean "unpaid". An expired or unknown task is an unknown
		// outcome.
		if st, gerr := p.upstreamTaskStatus(id); gerr != nil || st != mcp.TaskStatusFailed {
			return nil, engine.OutcomeLost, fmt.Errorf("the upstream's task %s gave no result (%w) and its status is %q", id, err, st)
		}
		return nil, engine.OutcomeToolError, err
	}
	if o := failure(ctx, cctx, err); o != engine.OutcomeRefused {
		return nil, o, err
	}
	// Not even a request not sent releases here: the task was created.
	return nil, engine.OutcomeLost, err
}

// toolResult reads a CallToolResult (or a tasks/result answer, which has
// its shape).
func toolResult(raw json.RawMessage) (*mcp.CallToolResult, engine.Outcome, error) {
	res, err := mcp.ParseCallToolResult(&raw)
	if err != nil {
		return nil, engine.OutcomeLost, fmt.Errorf("the upstream's result cannot be read: %w", err)
	}
	if res.IsError {
		return res, engine.OutcomeToolError, nil
	}
	return res, engine.OutcomeExecuted, nil
}

func (p *Proxy) upstreamTaskStatus(id string) (mcp.TaskStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := p.up.Request(ctx, string(mcp.MethodTasksGet), map[string]any{"taskId": id})
	if err != nil {
		return "", err
	}
	var t mcp.Task
	if err := json.Unmarshal(raw, &t); err != nil {
		return "", fmt.Errorf("the upstream's tasks/get answer cannot be read: %w", err)
	}
	return t.Status, nil
}

func (p *Proxy) cancelUpstreamTask(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.up.Request(ctx, string(mcp.MethodTasksCancel), map[string]any{"taskId": id}); err != nil {
		p.cfg.Logger.Warn("the upstream's task could not be cancelled", "upstream_task", id, "err", err)
	}
}

// The proxy's server runs a task-augmented call's handler with the
// request's context, which ends as soon as the task is created; a task's
// work must outlive it and end only when the task is cancelled. taskLinks
// joins the two ends, keyed by the call's task parameters (the one
// *mcp.TaskParams the server hands both the handler and its after-call
// hook): the handler's own cancel, and the proxy task's id, which the
// after-call hook learns from the created task and tasks/cancel names.
type taskLinks struct {
	mu       sync.Mutex
	byParams map[*mcp.TaskParams]*taskLink
	byID     map[string]*taskLink
}

type taskLink struct {
	tp        *mcp.TaskParams
	id        string
	cancel    context.CancelFunc
	cancelled bool
	finished  bool
}

func (l *taskLinks) get(tp *mcp.TaskParams) *taskLink {
	if l.byParams == nil {
		l.byParams, l.byID = map[*mcp.TaskParams]*taskLink{}, map[string]*taskLink{}
	}
	k := l.byParams[tp]
	if k == nil {
		k = &taskLink{tp: tp}
		l.byParams[tp] = k
	}
	return k
}

func (l *taskLinks) forget(k *taskLink) {
	delete(l.byParams, k.tp)
	if k.id != "" {
		delete(l.byID, k.id)
	}
}

// taskContext is the context a task's work runs in: the request's values,
// not its end; cancelled when the task is. done ends it.
func (p *Proxy) taskContext(ctx context.Context, tp *mcp.TaskParams) (context.Context, func()) {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l := &p.tasks
	l.mu.Lock()
	k := l.get(tp)
	k.cancel = cancel
	if k.cancelled {
		cancel()
	}
	l.mu.Unlock()
	return wctx, func() {
		l.mu.Lock()
		k.finished = true
		if k.id != "" {
			l.forget(k)
		}
		l.mu.Unlock()
		cancel()
	}
}

// taskCreated is the after-call hook's part: the proxy's task id of a
// task-augmented call.
func (p *Proxy) taskCreated(tp *mcp.TaskParams, id string) {
	l := &p.tasks
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.get(tp)
	k.id = id
	if k.finished {
		l.forget(k)
		return
	}
	l.byID[id] = k
}

// taskCancelled is the after-cancel hook's part: the server accepted the
// client's tasks/cancel of its own task, so its work ends.
func (p *Proxy) taskCancelled(id string) {
	l := &p.tasks
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.byID[id]
	if k == nil {
		return
	}
	k.cancelled = true
	if k.cancel != nil {
		k.cancel()
	}
}
