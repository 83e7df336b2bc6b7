//go:build !race

package main

// raceEnabled: the tests run without -race (which needs cgo), so the binary
// they start is built without it as well.
const raceEnabled = false
