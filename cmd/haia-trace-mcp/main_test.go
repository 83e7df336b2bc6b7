package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// binPath is the real binary the end-to-end tests start; TestMain builds it.
var binPath string

// binRace says whether binPath was built with the race detector.
var binRace bool

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "haia-trace-mcp-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "haia-trace-mcp")
	// Keys created by default go to the user's configuration directory;
	// keep the tests' keys in a throwaway one (children inherit it).
	os.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config"))
	// The binary is built with the race detector when the tests are, so a
	// plain `go test ./...` needs no C toolchain. HAIA_E2E_NORACE=1 builds it
	// without the detector even under -race (faster end-to-end runs).
	build := exec.Command("go", "build", "-o", binPath, ".")
	if raceEnabled && os.Getenv("HAIA_E2E_NORACE") == "" {
		build = exec.Command("go", "build", "-race", "-o", binPath, ".")
		binRace = true
	}
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	// HAIA_BENCH_BIN runs the tests and benchmarks against a binary built
	// elsewhere (an older commit, or one built with -tags pprof), so two
	// builds can be timed side by side with the same harness.
	if other := os.Getenv("HAIA_BENCH_BIN"); other != "" {
		binPath, build, binRace = other, nil, false
	}
	if build != nil {
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building the binary for end-to-end tests:", err)
			os.Exit(1)
		}
	}
	// One trusted reviewer, "alice", with her key and the trusted reviewers
	// file in that configuration directory: the review commands sign with
	// it by default, and servers started by the tests trust it.
	initReviewer := exec.Command(binPath, "reviewer", "init", "--id", "alice")
	initReviewer.Stdout, initReviewer.Stderr = io.Discard, os.Stderr
	if err := initReviewer.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "creating the test reviewer:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runCLI runs the real binary with args and returns stdout, stderr and the exit code.
func runCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	return runCLIEnv(t, nil, args...)
}

// runCLIEnv is runCLI with env added to the test's environment.
func runCLIEnv(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	return runBinEnv(t, binPath, env, args...)
}

// runBinEnv is runCLIEnv of the binary at bin (another build).
func runBinEnv(t *testing.T, bin string, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("run %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}

// mcpSession starts the real binary over stdio with args and connects the
// official Go SDK client to it.
func mcpSession(t *testing.T, stderr io.Writer, args ...string) *mcp.ClientSession {
	t.Helper()
	cs, _ := mcpSessionCmd(t, stderr, args...)
	return cs
}

// mcpSessionCmd is mcpSession that also returns the child process (to read
// its memory from /proc, or to signal it).
func mcpSessionCmd(t *testing.T, stderr io.Writer, args ...string) (*mcp.ClientSession, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	if stderr != nil {
		cmd.Stderr = stderr
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to %v: %v (stderr: %v)", args, err, stderr)
	}
	t.Cleanup(func() { cs.Close() })
	return cs, cmd
}

func TestVersionCommand(t *testing.T) {
	out, _, code := runCLI(t, "version")
	if code != 0 || !bytes.HasPrefix([]byte(out), []byte("haia-trace-mcp ")) {
		t.Fatalf("version: code %d, out %q", code, out)
	}
	_, errOut, code := runCLI(t, "no-such-command")
	if code != exitUsage || !bytes.Contains([]byte(errOut), []byte(`unknown command "no-such-command"`)) {
		t.Fatalf("unknown command: code %d, stderr %q", code, errOut)
	}
}

// aliceChains signs as the tests' trusted reviewer, whose key TestMain made
// in the default place.
func aliceChains(t *testing.T) *reviewlog.Chains {
	t.Helper()
	path, err := defaultConfigPath("reviewer-key.pem")
	if err != nil {
		t.Fatal(err)
	}
	key, err := noa.LoadKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return &reviewlog.Chains{Signer: noa.NewKeySigner(key), Tenant: "test"}
}

// serverTerms is an Ask hook that signs an opened review's terms with a
// server key of its own, as the engine does; tenant must be the tenant the
// Ask names.
func serverTerms(t *testing.T, tenant string) func(reviewlog.Tx, reviewlog.AskOutcome) error {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	chains := &reviewlog.Chains{Signer: noa.NewKeySigner(key), Tenant: tenant}
	return func(tx reviewlog.Tx, out reviewlog.AskOutcome) error {
		if out.Kind != reviewlog.AskOpened {
			return nil
		}
		d, err := reviewlog.TermsDraft(out.Review, tx.At)
		if err != nil {
			return err
		}
		_, err = chains.Append(context.Background(), tx.Store, d)
		return err
	}
}
