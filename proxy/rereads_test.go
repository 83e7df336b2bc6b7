package proxy

import (
	"sync/atomic"
	"testing"
	"time"
)

// A flood of list_changed while a re-read runs costs one more read after
// it, not one each; a notification after the reads are done reads again.
func TestRereadsRunOneAtATime(t *testing.T) {
	var r rereads
	var reads atomic.Int32
	started := make(chan struct{}, 1024)
	release := make(chan struct{})
	read := func() {
		reads.Add(1)
		started <- struct{}{}
		<-release
	}
	idle := func() {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; {
			r.mu.Lock()
			running := r.running
			r.mu.Unlock()
			if !running {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the re-reads never finished")
			}
			time.Sleep(time.Millisecond)
		}
	}

	r.run(read)
	<-started
	for range 1000 {
		r.run(read)
	}
	release <- struct{}{} // the first read ends; one more follows
	<-started
	release <- struct{}{}
	idle()
	if n := reads.Load(); n != 2 {
		t.Fatalf("%d reads for 1,001 notifications during one read, want 2", n)
	}
	if len(started) != 0 {
		t.Fatalf("%d reads started that were not waited for", len(started))
	}

	r.run(read)
	<-started
	release <- struct{}{}
	idle()
	if n := reads.Load(); n != 3 {
		t.Fatalf("%d reads, want 3: a notification after the reads are done reads again", n)
	}
}
