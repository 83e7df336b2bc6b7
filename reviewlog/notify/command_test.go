package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// writeScript writes an executable sh script to a temporary directory.
func writeScript(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "notify.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCommandGetsEveryMessageOnce(t *testing.T) {
	out := t.TempDir()
	// Each run writes its environment's two variables and its stdin to a
	// file of its own.
	script := writeScript(t, fmt.Sprintf(`f=%q/msg.$$
{ printf '%%s %%s\n' "$HAIA_NOTIFY_EVENT" "$HAIA_REVIEW_ID"; cat; } > "$f.tmp" && mv "$f.tmp" "$f"`, out))
	logger, logs := testLogger()
	m := NewMetrics()
	c, err := NewCommand(script, CommandEnv{}, Options{Logger: logger, Metrics: m, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	for i := range n {
		c.Notify(message(t, EventOpened, i))
		c.Notify(message(t, EventOpened, i)) // the same opening again: ignored
	}
	for i := range n / 2 {
		c.Notify(message(t, EventDecided, i))
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	files, err := filepath.Glob(filepath.Join(out, "msg.*"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		env, stdin, ok := strings.Cut(string(data), "\n")
		if !ok {
			t.Fatalf("%s: %q", f, data)
		}
		var d delivered
		if err := json.Unmarshal([]byte(stdin), &d); err != nil {
			t.Fatalf("stdin of a run is not the JSON body: %v: %q", err, stdin)
		}
		if env != d.Event+" "+d.Review.ID {
			t.Errorf("environment %q does not match the body's %s %s", env, d.Event, d.Review.ID)
		}
		if !strings.Contains(d.Text, d.Review.ID) {
			t.Errorf("text %q does not name the review", d.Text)
		}
		seen[d.Event+" "+d.Review.ID]++
	}
	want := n + n/2
	if len(seen) != want || len(files) != want {
		t.Errorf("%d runs for %d distinct messages; want %d of each", len(files), len(seen), want)
	}
	for k, v := range seen {
		if v != 1 {
			t.Errorf("%s delivered %d times", k, v)
		}
	}
	if got := m.Snapshot(SinkCommand); got.Sent != uint64(want) || got.Failed != 0 || got.Dropped != 0 {
		t.Errorf("counts = %+v; log:\n%s", got, logs)
	}
}

// TestCommandFailures: each failure is counted and logged as what it was.
// A command that fails on its own gets a limit no load reaches (a shell
// that starts slowly on a busy machine must still be seen to exit 1, not
// be cut off); a command that never ends gets a short one and must be cut
// off by it — killed, its children too — long before it would end itself.
func TestCommandFailures(t *testing.T) {
	const patient, short = time.Minute, 200 * time.Millisecond
	tests := []struct {
		name    string
		script  string
		timeout time.Duration
		wantLog string
	}{
		{"non-zero exit", `echo "no route to chat server" >&2; exit 3`, patient, "exit status 3; its standard error begins: no route to chat server"},
		{"hostile standard error", "printf 'a\\033[2Jb' >&2; exit 1", patient, `a\\u001b[2Jb`},
		{"timeout kills it", "sleep 60", short, "ran longer than 200ms and was killed"},
		{"timeout kills its children too", "sleep 60 & wait", short, "ran longer than 200ms and was killed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logger, logs := testLogger()
			m := NewMetrics()
			c, err := NewCommand(writeScript(t, tt.script), CommandEnv{}, Options{Logger: logger, Metrics: m, Timeout: tt.timeout})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			c.Notify(message(t, EventOpened, 1))
			if err := c.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := m.Snapshot(SinkCommand); got.Failed != 1 || got.Sent != 0 {
				t.Errorf("counts = %+v", got)
			}
			if !strings.Contains(logs.String(), tt.wantLog) {
				t.Errorf("log lacks %q:\n%s", tt.wantLog, logs)
			}
			if tt.timeout == patient && strings.Contains(logs.String(), "was killed") {
				t.Errorf("a command that ends by itself was cut off:\n%s", logs)
			}
			if took := time.Since(start); tt.timeout == short && took >= 50*time.Second {
				t.Errorf("the command was waited for (%s), not cut off", took)
			}
		})
	}
}

func TestCommandCloseAbortsAtDeadline(t *testing.T) {
	logger, logs := testLogger()
	m := NewMetrics()
	c, err := NewCommand(writeScript(t, "sleep 60"), CommandEnv{}, Options{Logger: logger, Metrics: m, Workers: 1, QueueSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		c.Notify(message(t, EventOpened, i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Close(ctx); err == nil || !strings.Contains(err.Error(), "shutdown did not wait") {
		t.Fatalf("Close with an ended context = %v", err)
	}
	got := m.Snapshot(SinkCommand)
	if got.Sent != 0 || got.Failed+got.Dropped != 3 {
		t.Errorf("counts = %+v; want the 3 messages failed or dropped; log:\n%s", got, logs)
	}
}

func TestNewCommandRefuses(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain.sh")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, path, want string }{
		{"empty", "", "is empty"},
		{"missing", filepath.Join(dir, "nope"), "no such file"},
		{"not executable", plain, "is not an executable file"},
		{"directory", dir, "is not an executable file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewCommand(tt.path, CommandEnv{}, Options{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				if c != nil {
					_ = c.Close(context.Background())
				}
				t.Fatalf("NewCommand(%q) = %v; want %q", tt.path, err, tt.want)
			}
		})
	}
}

// TestCommandEnvironmentIsMinimal: the hook sees exactly its own two
// variables, PATH and the variables the operator named — never the
// server's other variables, such as HAIA_STORE with the database password.
// The script reports /proc/self/environ of its shell as exec gave it.
func TestCommandEnvironmentIsMinimal(t *testing.T) {
	server := map[string]string{
		"PATH":           "/opt/hooks/bin:/usr/bin:/bin",
		"HAIA_STORE":     "postgres://guard:s3cret@db.internal/guard",
		"AWS_SECRET_KEY": "AKIA-secret",
		"HOME":           "/home/guard",
		"PAGER_TOKEN":    "pager-token-value",
		"EMPTY_BUT_SET":  "",
	}
	lookup := func(k string) (string, bool) { v, ok := server[k]; return v, ok }
	tests := []struct {
		name   string
		pass   []string
		lookup func(string) (string, bool)
		want   []string
		link   string
	}{
		{"a console serves", nil, lookup,
			[]string{"HAIA_NOTIFY_EVENT=review.opened", "HAIA_REVIEW_ID=r-1", "HAIA_REVIEW_URL=https://reviews.example/console/reviews/r-1", "PATH=/opt/hooks/bin:/usr/bin:/bin"},
			"https://reviews.example/console/reviews/r-1"},
		{"nothing named", nil, lookup,
			[]string{"HAIA_NOTIFY_EVENT=review.opened", "HAIA_REVIEW_ID=r-1", "PATH=/opt/hooks/bin:/usr/bin:/bin"}, ""},
		{"one variable named", []string{"PAGER_TOKEN"}, lookup,
			[]string{"HAIA_NOTIFY_EVENT=review.opened", "HAIA_REVIEW_ID=r-1", "PAGER_TOKEN=pager-token-value", "PATH=/opt/hooks/bin:/usr/bin:/bin"}, ""},
		{"a named variable set empty, one unset, PATH named again", []string{"EMPTY_BUT_SET", "NOT_SET", "PATH"}, lookup,
			[]string{"EMPTY_BUT_SET=", "HAIA_NOTIFY_EVENT=review.opened", "HAIA_REVIEW_ID=r-1", "PATH=/opt/hooks/bin:/usr/bin:/bin"}, ""},
		{"a server without PATH", nil, func(string) (string, bool) { return "", false },
			[]string{"HAIA_NOTIFY_EVENT=review.opened", "HAIA_REVIEW_ID=r-1", "PATH=" + DefaultPath}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "env")
			script := writeScript(t, fmt.Sprintf(`cat /proc/$$/environ > %q.tmp && mv %q.tmp %q`, out, out, out))
			logger, logs := testLogger()
			g, err := New(Config{Command: script, Env: tt.pass, Lookup: tt.lookup}, Options{Logger: logger})
			if err != nil {
				t.Fatal(err)
			}
			m := message(t, EventOpened, 1)
			m.ReviewID = "r-1"
			m.ReviewURL = tt.link
			g.Notify(m)
			if err := g.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(out)
			if err != nil {
				t.Fatalf("the hook did not run: %v\n%s", err, logs.String())
			}
			got := strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("the hook's environment\n got %q\nwant %q", got, tt.want)
			}
			for _, secret := range []string{"s3cret", "AKIA-secret", "/home/guard"} {
				if strings.Contains(string(data), secret) {
					t.Fatalf("the hook saw %q", secret)
				}
			}
			if slices.Contains(tt.pass, "NOT_SET") && !strings.Contains(logs.String(), "NOT_SET") {
				t.Errorf("a named variable that is not set was not warned about: %s", logs.String())
			}
		})
	}
}

func TestCommandEnvironmentRefusals(t *testing.T) {
	script := writeScript(t, "exit 0")
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Command: script, Env: []string{"A=B"}}, `--notify-env "A=B" is not a variable name`},
		{Config{Command: script, Env: []string{""}}, `--notify-env "" is not a variable name`},
		{Config{Command: script, Env: []string{"9LIVES"}}, `is not a variable name`},
		{Config{Command: script, Env: []string{"X\nY"}}, `is not a variable name`},
		{Config{Command: script, Env: []string{"HAIA_REVIEW_ID"}}, "the hook always gets its own"},
		{Config{Command: script, Env: []string{"TOKEN", "TOKEN"}}, "--notify-env TOKEN is given twice"},
		{Config{Env: []string{"TOKEN"}}, "--notify-env is set but --notify-command is not"},
	} {
		g, err := New(c.cfg, Options{})
		if err == nil {
			_ = g.Close(context.Background())
			t.Errorf("%+v accepted", c.cfg)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v; want %q", c.cfg, err, c.want)
		}
	}
}
