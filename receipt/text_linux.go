package receipt

import (
	"os"
	"syscall"
)

// mapText maps the first n bytes of f read-only and returns them with the
// function that unmaps them, or ok false where the file cannot be mapped
// (the caller then reads it). The pages are the file's own in the page
// cache: a run just written or read by another process costs no fresh
// memory and no copy. Fresh pages are what the build paid most for on a
// virtual machine that hands freed memory back to its host: right after a
// process that freed a lot (the Python floor), zeroing the 64 MB a copy of
// the build run needed took 0.15–0.3 s of system time, more than the
// parsing. Bytes changed under the mapping are caught by the events' sums
// (see Event.changed), and a read past a cut file's end by the fault guard
// (see guarded).
func mapText(f *os.File, n int) (text []byte, release func(), ok bool) {
	if n <= 0 {
		return nil, nil, false
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, false
	}
	return m, func() { _ = syscall.Munmap(m) }, true
}
