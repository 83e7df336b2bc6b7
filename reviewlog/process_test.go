package reviewlog_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
)

// The test binary doubles as the other processes of the concurrency tests:
// with REVIEWLOG_HELPER set, TestMain runs that helper instead of the tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("REVIEWLOG_HELPER"); mode != "" {
		os.Exit(helper(mode, os.Getenv("REVIEWLOG_ROOT"), os.Getenv("REVIEWLOG_ID")))
	}
	os.Exit(m.Run())
}

// Helper exit codes.
const (
	helperOK      = 0
	helperFail    = 1
	helperDecided = 4
)

func helper(mode, dir, id string) int {
	root, err := confined.OpenRoot(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return helperFail
	}
	l := reviewlog.OpenStore(filestore.New(root), reviewlog.Options{LockWait: 20 * time.Second})
	ctx := context.Background()
	signed, err := termsSigner()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return helperFail
	}
	switch mode {
	case "open":
		// Several goroutines of this process ask the same question.
		var wg sync.WaitGroup
		var mu sync.Mutex
		code := helperOK
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, _, err := engine.OpenReview(ctx, l, q1, reasons, signed)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					code = helperFail
					return
				}
				fmt.Println(r.ID)
			}()
		}
		wg.Wait()
		return code
	case "decide":
		_, err := l.DecideReview(ctx, id, reviewlog.Approved, "", fmt.Sprintf("pid-%d", os.Getpid()), nil)
		switch {
		case err == nil:
			return helperOK
		case errors.Is(err, reviewlog.ErrAlreadyDecided):
			return helperDecided
		}
		fmt.Fprintln(os.Stderr, err)
		return helperFail
	case "torn":
		// Take the lock as a writer would, write half a line, then wait to
		// be killed.
		g, err := root.MkdirAll(reviewlog.DirName, 0o700)
		if err != nil {
			return helperFail
		}
		lock, err := g.OpenFile(reviewlog.LockName, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil || unix.Flock(int(lock.Fd()), unix.LOCK_EX) != nil {
			return helperFail
		}
		f, err := g.OpenFile(reviewlog.FileName, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return helperFail
		}
		f.Write([]byte(`{"type":"decided","review_id":"` + id + `","at":"2026-07-25T1`))
		f.Sync()
		fmt.Println("ready")
		time.Sleep(time.Hour)
	}
	return helperFail
}

func helperCmd(t *testing.T, mode, dir, id string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "REVIEWLOG_HELPER="+mode, "REVIEWLOG_ROOT="+dir, "REVIEWLOG_ID="+id)
	return cmd
}

// Several processes, each with several goroutines, and goroutines of this
// process ask the same question at once: exactly one review opens and
// every answer carries its id.
func TestProcessesOpenOnce(t *testing.T) {
	dir := t.TempDir()
	const procs = 4
	type result struct {
		out []byte
		err error
	}
	results := make([]result, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := helperCmd(t, "open", dir, "")
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				err = fmt.Errorf("%w: %s", err, stderr.String())
			}
			results[i] = result{out, err}
		}()
	}
	l := openLog(t, dir, reviewlog.Options{LockWait: 20 * time.Second})
	local := make([]string, 4)
	for i := range local {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, _, err := engine.OpenReview(context.Background(), l, q1, reasons, signTerms(t))
			if err != nil {
				t.Error(err)
			}
			local[i] = r.ID
		}()
	}
	wg.Wait()

	ids := append([]string{}, local...)
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("process %d: %v", i, r.err)
		}
		ids = append(ids, strings.Fields(string(r.out))...)
	}
	if len(ids) != 4+procs*4 {
		t.Fatalf("%d answers, want %d", len(ids), 4+procs*4)
	}
	for _, id := range ids {
		if id != ids[0] {
			t.Errorf("answers differ: %v", ids)
			break
		}
	}
	if n := strings.Count(readFile(t, dir), `"type":"opened"`); n != 1 {
		t.Errorf("%d reviews opened, want 1", n)
	}
}

// Several processes decide the same review at once: exactly one succeeds,
// the others are told it is already decided.
func TestProcessesDecideOnce(t *testing.T) {
	dir := t.TempDir()
	l := newLog(t, dir, nil)
	r, _, err := engine.OpenReview(context.Background(), l, q1, reasons, signTerms(t))
	if err != nil {
		t.Fatal(err)
	}
	const procs = 6
	codes := make([]int, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := helperCmd(t, "decide", dir, r.ID)
			err := cmd.Run()
			var ee *exec.ExitError
			switch {
			case err == nil:
				codes[i] = 0
			case errors.As(err, &ee):
				codes[i] = ee.ExitCode()
			default:
				t.Error(err)
				codes[i] = -1
			}
		}()
	}
	wg.Wait()
	ok, decided := 0, 0
	for _, c := range codes {
		switch c {
		case helperOK:
			ok++
		case helperDecided:
			decided++
		}
	}
	if ok != 1 || decided != procs-1 {
		t.Errorf("exit codes %v: %d succeeded, %d already decided", codes, ok, decided)
	}
	if n := strings.Count(readFile(t, dir), `"type":"decided"`); n != 1 {
		t.Errorf("%d decided lines", n)
	}
}

// A writer killed (SIGKILL) half-way through a line leaves a log that still
// reads, its lock is released by the kernel, and the next append starts on
// a new line.
func TestKilledWriter(t *testing.T) {
	dir := t.TempDir()
	l, alice := newSignedLog(t, dir, nil)
	r, _, err := engine.OpenReview(context.Background(), l, q1, reasons, signTerms(t))
	if err != nil {
		t.Fatal(err)
	}
	cmd := helperCmd(t, "torn", dir, r.ID)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		cmd.Process.Kill()
		t.Fatalf("helper: %q %v", line, err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	if !strings.HasSuffix(readFile(t, dir), `"at":"2026-07-25T1`) {
		t.Fatalf("the helper did not leave a torn line")
	}
	if got, err := l.Get(context.Background(), r.ID); err != nil || got.Status != reviewlog.Pending {
		t.Fatalf("read after the kill: %+v %v", got, err)
	}
	if _, err := l.DecideReview(context.Background(), r.ID, reviewlog.Rejected, "after a crash", "alice", alice.sign(t)); err != nil {
		t.Fatalf("append after the kill: %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(readFile(t, dir), "\n"), "\n")
	if len(lines) != 4 || !strings.HasSuffix(lines[1], `"at":"2026-07-25T1`) || !strings.HasPrefix(lines[2], `{"type":"repair"`) || !strings.HasPrefix(lines[3], `{"type":"decided"`) {
		t.Fatalf("log after the kill:\n%s", strings.Join(lines, "\n"))
	}
	if got, err := l.Get(context.Background(), r.ID); err != nil || got.Status != reviewlog.Rejected || got.Note != "after a crash" {
		t.Errorf("after the repair: %+v %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(dir, reviewlog.DirName, reviewlog.LockName)); err != nil {
		t.Errorf("lock file: %v", err)
	}
}
