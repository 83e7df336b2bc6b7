package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
)

// maxStderrBytes is how much of a failing command's standard error is kept
// for the log.
const maxStderrBytes = 2048

// Command runs an operator's program for each message (--notify-command).
type Command struct {
	*queue
	path    string
	timeout time.Duration
}

// NewCommand checks that path is an executable regular file and starts the
// sink. For each message the program is run directly (no shell, no
// arguments) with the body {"event", "review", "text"} on standard input
// and HAIA_NOTIFY_EVENT and HAIA_REVIEW_ID added to the environment. A run
// that outlives opts.Timeout is killed with its process group; a non-zero
// exit is logged with the start of its standard error, and counted.
func NewCommand(path string, opts Options) (*Command, error) {
	if path == "" {
		return nil, errors.New("notify: the notification command is empty")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("notify: resolve the notification command %s: %w", path, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("notify: the notification command: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("notify: the notification command %s is not an executable file (mode %s)", abs, fi.Mode())
	}
	o := opts.withDefaults()
	c := &Command{path: abs, timeout: o.Timeout}
	c.queue = newQueue(SinkCommand, o, c.run)
	return c, nil
}

// Path is the program that is run.
func (c *Command) Path() string { return c.path }

func (c *Command) run(ctx context.Context, j job) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.path)
	cmd.Stdin = bytes.NewReader(j.body)
	cmd.Env = append(os.Environ(), "HAIA_NOTIFY_EVENT="+j.msg.Event, "HAIA_REVIEW_ID="+j.msg.ReviewID)
	stderr := &capped{max: maxStderrBytes}
	cmd.Stderr = stderr
	// Its own process group, so that a timeout kills what it started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A child that keeps standard error open does not hold Wait for long.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	switch {
	case err == nil:
		return nil
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("%s ran longer than %s and was killed", c.path, c.timeout)
	case ctx.Err() != nil:
		return fmt.Errorf("%s was killed at shutdown", c.path)
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			return fmt.Errorf("%s failed: %s", c.path, exit.ProcessState)
		}
		return fmt.Errorf("%s failed: %s; its standard error begins: %s", c.path, exit.ProcessState, termsafe.String(msg))
	}
	return fmt.Errorf("run %s: %w", c.path, err)
}

// capped keeps the first max bytes written to it and discards the rest.
type capped struct {
	buf bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (c *capped) String() string { return c.buf.String() }
