package main

import (
	"math"
	"os"
	"runtime/debug"
	"sync"
)

// coldReadPercent is the collector's target (GOGC) while the run index
// reads a large amount of run files, such as a cold index's first listing:
// the heap grows from nothing to what the index keeps, and at the default
// 100 the collector would run a dozen times on the way and mark what is
// being built each time (a fifth of the read's work on the 300k-event
// root). The soft memory limit still bounds the heap, so a root near the
// index's budget collects as it did.
const coldReadPercent = 400

// coldReadMinBytes is the least a refresh must read for coldRead to change
// the collector's target: an append or a few new runs read far less.
const coldReadMinBytes = 32 << 20

// coldRead raises the collector's target while the run indexes read in
// bulk, and puts it back when the last of them is done. Several tenants'
// indexes may read at once; the first raises it, the last restores it.
type coldRead struct {
	mu       sync.Mutex
	readers  int
	previous int
}

// newColdRead returns the hook for app.Config.Reading, or nil when the
// operator set GOGC (their target stands).
func newColdRead() *coldRead {
	if os.Getenv("GOGC") != "" {
		return nil
	}
	return &coldRead{}
}

// reading is app.Config.Reading: it raises the target for a read of at
// least coldReadMinBytes, and only under a soft memory limit (the
// server's own, from the index's budget, or GOMEMLIMIT), which keeps the
// heap bounded whatever the target.
func (c *coldRead) reading(bytes int64) (done func()) {
	if bytes < coldReadMinBytes || debug.SetMemoryLimit(-1) == math.MaxInt64 {
		return func() {}
	}
	c.mu.Lock()
	if c.readers == 0 {
		c.previous = debug.SetGCPercent(coldReadPercent)
	}
	c.readers++
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			c.readers--
			if c.readers == 0 {
				debug.SetGCPercent(c.previous)
			}
			c.mu.Unlock()
		})
	}
}
