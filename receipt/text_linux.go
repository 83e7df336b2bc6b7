package receipt

import "syscall"

// runText returns a zeroed buffer of n bytes outside the Go heap, asked to
// be backed by 2 MiB pages, and the function that gives it back. A 64 MB
// run read into the heap takes about 16,000 page faults of 4 KiB, a large
// part of the build command's time on a virtual machine; in huge pages it
// takes a few dozen. A kernel without transparent huge pages still gives
// ordinary pages; one that refuses the mapping gets a heap buffer.
func runText(n int) (buf []byte, release func()) {
	if n < hugePage {
		return make([]byte, n), func() {}
	}
	m, err := syscall.Mmap(-1, 0, (n+hugePage-1)/hugePage*hugePage, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return make([]byte, n), func() {}
	}
	_ = syscall.Madvise(m, syscall.MADV_HUGEPAGE) // advice: without it, ordinary pages
	return m[:n], func() { _ = syscall.Munmap(m) }
}

const hugePage = 2 << 20
