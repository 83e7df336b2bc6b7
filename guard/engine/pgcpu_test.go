package engine

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// clockTicks is the unit of utime and stime in /proc/<pid>/stat (USER_HZ,
// 100 on every Linux the benchmarks run on).
const clockTicks = 100

// backendCPU is the CPU time, in clock ticks, that the PostgreSQL
// backends serving the database at dsn have used so far, by pid. It reads
// /proc, so it needs the server on this machine (and a user who may read
// its processes' stat files); it returns nil, saying nothing, otherwise.
// The backends of the benchmark's own database are the benchmark's
// alone: pgtest.Database made it fresh.
func backendCPU(tb testing.TB, dsn string) map[int]int64 {
	tb.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatalf("backend CPU: %v", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	if err != nil {
		tb.Fatalf("backend CPU: %v", err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		tb.Fatalf("backend CPU: %v", err)
	}
	out := map[int]int64{}
	for _, pid := range pids {
		ticks, err := procTicks(int(pid))
		if err != nil {
			return nil // not on this machine, or not ours to read
		}
		out[int(pid)] = ticks
	}
	return out
}

// procTicks is utime + stime of process pid, in clock ticks.
func procTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command (field 2) is in parentheses and may hold spaces: the
	// fields counted from after its closing one.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// utime and stime are fields 14 and 15; f[0] is field 3.
	u, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, err
	}
	st, err := strconv.ParseInt(f[12], 10, 64)
	if err != nil {
		return 0, err
	}
	return u + st, nil
}

// backendCPUSince is the backends' CPU, in ms, used between before and
// now (a backend that started since counts whole); ok is false where
// /proc could not be read.
func backendCPUSince(tb testing.TB, dsn string, before map[int]int64) (ms float64, ok bool) {
	after := backendCPU(tb, dsn)
	if before == nil || after == nil {
		return 0, false
	}
	var ticks int64
	for pid, t := range after {
		ticks += t - before[pid]
	}
	return float64(ticks) * 1000 / clockTicks, true
}

// procTicks reads this process's CPU: it grows by the CPU a busy loop
// spends (at least half of it, a tick being 10 ms).
func TestProcTicks(t *testing.T) {
	before, err := procTicks(os.Getpid())
	if err != nil {
		// Only Linux is bound to have it; there its absence is a failure.
		if runtime.GOOS == "linux" {
			t.Fatalf("/proc cannot be read on Linux: %v", err)
		}
		t.Skipf("/proc cannot be read on %s (it is Linux's): %v", runtime.GOOS, err)
	}
	self := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	cpu0 := self()
	x := 0
	for self()-cpu0 < 300*time.Millisecond {
		for i := range 100000 {
			x += i
		}
	}
	after, err := procTicks(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got := after - before; got < 15 || x == 0 {
		t.Errorf("procTicks grew by %d ticks over 300 ms of CPU, want at least 15", got)
	}
}
