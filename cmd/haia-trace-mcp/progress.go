package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
)

// progress shows what a long command is doing, on one line of a terminal:
// each step replaces the last, and done clears it. When the writer is not
// a terminal (piped, redirected, a test) it writes nothing at all, so logs
// and scripts see only the command's own output.
type progress struct {
	mu      sync.Mutex
	w       io.Writer
	name    string
	tty     bool
	started time.Time
	shown   bool
	// drawn is when runs last drew the line (it redraws at most every
	// 100 ms, so a root of many runs costs the terminal little).
	drawn time.Time
}

func newProgress(w io.Writer, name string) *progress {
	return &progress{w: w, name: name, tty: isTerminal(w), started: time.Now()}
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}

// step replaces the line with what is being done now.
func (p *progress) step(what string) {
	if !p.tty {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "\r\033[K%s: %s (%s)", p.name, termsafe.String(what), time.Since(p.started).Round(time.Second))
	p.shown = true
}

// done clears the line.
func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.shown {
		fmt.Fprint(p.w, "\r\033[K")
		p.shown = false
	}
}

// during runs fn, redrawing what with the time it has taken every second
// on a terminal, and clears the line when fn returns.
func (p *progress) during(what string, fn func() error) error {
	if !p.tty {
		return fn()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		p.step(what)
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				p.step(what)
			}
		}
	}()
	err := fn()
	close(stop)
	wg.Wait()
	p.done()
	return err
}

// runs shows how far a run index refresh is: "index: 12 of 60 runs read".
// It is a catalog's Progress; the line clears when the last run is read,
// so a refresh that reads one run shows nothing.
func (p *progress) runs(done, total int) {
	if !p.tty {
		return
	}
	if done >= total {
		p.done()
		return
	}
	p.mu.Lock()
	now := time.Now()
	draw := done == 1 || now.Sub(p.drawn) >= 100*time.Millisecond
	if draw {
		p.drawn = now
	}
	p.mu.Unlock()
	if draw {
		p.step(fmt.Sprintf("%d of %d runs read", done, total))
	}
}
