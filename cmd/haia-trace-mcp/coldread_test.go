package main

import (
	"math"
	"runtime/debug"
	"testing"
)

// gcPercent reads the collector's target without changing it.
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func TestColdReadRaisesTheTargetUnderALimitOnly(t *testing.T) {
	t.Setenv("GOGC", "")
	before, limit := gcPercent(), debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetGCPercent(before); debug.SetMemoryLimit(limit) })
	debug.SetGCPercent(100)

	debug.SetMemoryLimit(math.MaxInt64) // no soft limit: nothing bounds the heap
	c := newColdRead()
	done := c.reading(1 << 30)
	if got := gcPercent(); got != 100 {
		t.Fatalf("without a memory limit the target became %d", got)
	}
	done()

	debug.SetMemoryLimit(896 << 20)
	small := c.reading(coldReadMinBytes - 1)
	if got := gcPercent(); got != 100 {
		t.Fatalf("a small read set the target to %d", got)
	}
	small()

	// Two indexes reading at once: the first raises, the last restores.
	a := c.reading(coldReadMinBytes)
	b := c.reading(1 << 30)
	if got := gcPercent(); got != coldReadPercent {
		t.Fatalf("during a cold read the target is %d, want %d", got, coldReadPercent)
	}
	a()
	a() // a second call changes nothing
	if got := gcPercent(); got != coldReadPercent {
		t.Fatalf("with one reader left the target is %d, want %d", got, coldReadPercent)
	}
	b()
	if got := gcPercent(); got != 100 {
		t.Fatalf("after the reads the target is %d, want 100 back", got)
	}
}

func TestColdReadLeavesTheOperatorsGOGC(t *testing.T) {
	t.Setenv("GOGC", "150")
	if newColdRead() != nil {
		t.Fatal("with GOGC set the server would still change the collector's target")
	}
}
