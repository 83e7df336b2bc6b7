package engine

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the CPU time this process used so far (user and system): on
// a shared machine the wall clock says as much about the neighbours.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkForwardedCall is the engine's part of a call the guard proxy
// forwards: the question (decision, reservation, receipt) and the outcome
// (receipt), on the file store. It reports the CPU time per call and the
// two halves' wall time in ms per call:
//
//	go test -run '^$' -bench ForwardedCall -benchtime 200x -cpuprofile cpu.out ./guard/engine/
func BenchmarkForwardedCall(b *testing.B) {
	f := newFixture(b, b.TempDir(), `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "1000000000", "windowHours": 1}, "reservationMinutes": 15}`)
	ctx := context.Background()
	var check, outcome time.Duration
	cpu0 := cpuTime(b)
	b.ResetTimer()
	for i := range b.N {
		q, c := payCall("0.01", strconv.Itoa(i))
		t0 := time.Now()
		a, err := f.eng.CheckCall(ctx, "bot", q, c)
		t1 := time.Now()
		if err != nil || a.Reservation == nil {
			b.Fatalf("%+v %v", a, err)
		}
		if _, err := f.eng.RecordOutcome(ctx, "bot", a, OutcomeExecuted); err != nil {
			b.Fatal(err)
		}
		check += t1.Sub(t0)
		outcome += time.Since(t1)
	}
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N)/1e6, "cpu-ms")
	b.ReportMetric(float64(check)/float64(b.N)/1e6, "check-ms")
	b.ReportMetric(float64(outcome)/float64(b.N)/1e6, "outcome-ms")
}
