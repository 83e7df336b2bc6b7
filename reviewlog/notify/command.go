package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	env     []string // NAME=value of PATH and the variables the operator named
}

// DefaultPath is the PATH a hook gets when the server has none.
const DefaultPath = "/usr/local/bin:/usr/bin:/bin"

// The variables of the notification itself; an operator cannot name them.
const (
	envEvent     = "HAIA_NOTIFY_EVENT"
	envReviewID  = "HAIA_REVIEW_ID"
	envReviewURL = "HAIA_REVIEW_URL"
)

// CommandEnv is the environment a hook may see beyond its own variables.
type CommandEnv struct {
	// Pass names the server's variables the hook gets (--notify-env,
	// repeatable); nothing else of the server's environment reaches it.
	Pass []string
	// Lookup reads the server's environment; os.LookupEnv when nil.
	Lookup func(string) (string, bool)
}

// build is PATH (the server's, else DefaultPath) and every named variable
// that is set, read once. A name that is not a variable name, is repeated,
// or is one of the notification's own is refused; a named variable that is
// not set is returned in missing, for the caller to warn about.
func (e CommandEnv) build() (env, missing []string, err error) {
	lookup := e.Lookup
	if lookup == nil {
		lookup = os.LookupEnv
	}
	path, ok := lookup("PATH")
	if !ok || path == "" {
		path = DefaultPath
	}
	env = []string{"PATH=" + path}
	seen := map[string]bool{"PATH": true}
	for _, name := range e.Pass {
		if !isEnvName(name) {
			return nil, nil, fmt.Errorf("notify: --notify-env %q is not a variable name (letters, digits and _, not starting with a digit)", termsafe.String(name))
		}
		if name == envEvent || name == envReviewID || name == envReviewURL {
			return nil, nil, fmt.Errorf("notify: --notify-env %s: the hook always gets its own %s, %s and (with a console) %s", name, envEvent, envReviewID, envReviewURL)
		}
		if seen[name] {
			if name == "PATH" {
				continue // always passed
			}
			return nil, nil, fmt.Errorf("notify: --notify-env %s is given twice", name)
		}
		seen[name] = true
		v, ok := lookup(name)
		if !ok {
			missing = append(missing, name)
			continue
		}
		env = append(env, name+"="+v)
	}
	return env, missing, nil
}

func isEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// NewCommand checks that path is an executable regular file and starts the
// sink. For each message the program is run directly (no shell, no
// arguments) with the body {"event", "review", "text"} on standard input
// and a minimal environment: HAIA_NOTIFY_EVENT, HAIA_REVIEW_ID,
// HAIA_REVIEW_URL (the console's page of the review, with a console), PATH and
// only the variables env names — never the rest of the server's
// environment (HAIA_STORE holds the database password). A run that
// outlives opts.Timeout is killed with its process group; a non-zero exit
// is logged with the start of its standard error, and counted.
func NewCommand(path string, env CommandEnv, opts Options) (*Command, error) {
	if path == "" {
		return nil, errors.New("notify: the notification command is empty")
	}
	vars, missing, err := env.build()
	if err != nil {
		return nil, err
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
	if len(missing) > 0 {
		o.Logger.Warn("notify: variables named with --notify-env are not set, so the hook will not get them", "names", missing)
	}
	c := &Command{path: abs, timeout: o.Timeout, env: vars}
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
	cmd.Env = append(slices.Clip(c.env), envEvent+"="+j.msg.Event, envReviewID+"="+j.msg.ReviewID)
	if j.msg.ReviewURL != "" {
		cmd.Env = append(cmd.Env, envReviewURL+"="+j.msg.ReviewURL)
	}
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
