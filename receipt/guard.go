package receipt

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
)

// ErrRunCut is the error of a build whose run file was cut short while
// it was mapped (see ReadRunFileHeld): a read past its new end faulted.
var ErrRunCut = errors.New("the run file was cut short while it was being built (a run is only ever appended to)")

// ErrRunChanged is the error of a build whose run file was rewritten in
// place while it was mapped: an event's line no longer has the sum it was
// decoded with. The output stops before the batch holding that event.
var ErrRunChanged = errors.New("the run file changed while it was being built (a run is only ever appended to); the output stops before that event")

// Guard runs fn, which reads events of ReadRunFileHeld, with a fault on
// their mapped text turned into ErrRunCut instead of a crash (see
// debug.SetPanicOnFault); the package's goroutines that fn starts pass
// such a fault back to it. Other panics go on as they are.
func Guard(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if !isFault(r) {
				panic(r)
			}
			err = fmt.Errorf("%w: %v", ErrRunCut, r)
		}
	}()
	return fn()
}

// guarded runs fn on a goroutine of the package's own and returns the
// fault it met reading mapped text, for the goroutine that waits for it
// to panic with again (and so reach Guard). Other panics go on as they are.
func guarded(fn func()) (fault any) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if !isFault(r) {
				panic(r)
			}
			fault = r
		}
	}()
	fn()
	return nil
}

// isFault reports whether r is the panic of a fault at a non-nil address
// (with SetPanicOnFault); a nil dereference is a bug and stays a panic.
func isFault(r any) bool {
	_, isErr := r.(runtime.Error)
	_, hasAddr := r.(interface{ Addr() uintptr })
	return isErr && hasAddr
}
