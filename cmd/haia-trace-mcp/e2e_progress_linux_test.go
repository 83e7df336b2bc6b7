package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// openPTY opens a pseudo-terminal pair: what the child writes to slave,
// the test reads from master.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal here (%v): the progress on a terminal cannot be shown", err)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		m.Close()
		t.Fatalf("unlock the pseudo-terminal: %v", e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		m.Close()
		t.Fatalf("name the pseudo-terminal: %v", e)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	return m, s
}

// The server started on a terminal shows the first (cold) read of a Trace
// root's runs as it goes, then clears the line; started with stderr piped
// (as an agent host starts it), it shows nothing of it.
func TestColdIndexShowsProgressOnATerminal(t *testing.T) {
	root := filepath.Join(t.TempDir(), ".trace")
	for i := range 40 {
		rec, err := simrec.New(root, fmt.Sprintf("run-%02d", i), time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC))
		if err != nil {
			t.Fatal(err)
		}
		if err := rec.Pay(simrec.Payment{OperationID: "op", URL: "https://a.example.com/x", PayTo: sellerA, Amount: "1000", Outcome: "settled"}); err != nil {
			t.Fatal(err)
		}
	}
	key := filepath.Join(t.TempDir(), "signing.pem")
	list := func(stderr io.Writer) {
		t.Helper()
		cs, _ := mcpSessionCmd(t, stderr, "--dir", root, "--key-file", key)
		res := callTool(t, cs, "list_operations", map[string]any{"limit": 1})
		if res.IsError {
			t.Fatalf("list_operations: %s", resultText(res))
		}
		cs.Close()
	}

	master, slave := openPTY(t)
	defer master.Close()
	var mu sync.Mutex
	var seen bytes.Buffer
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			mu.Lock()
			seen.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	list(slave)
	slave.Close()
	waitFor(t, "the terminal to show the index's progress and clear it", func() bool {
		mu.Lock()
		defer mu.Unlock()
		s := seen.String()
		i := strings.Index(s, "index: 1 of 40 runs read")
		return i >= 0 && strings.Contains(s[i:], "\r\033[K")
	})

	piped := &lockedBuffer{}
	list(piped)
	if strings.Contains(piped.String(), "runs read") || strings.Contains(piped.String(), "\033[K") {
		t.Errorf("progress written to a pipe:\n%s", piped.String())
	}
}
