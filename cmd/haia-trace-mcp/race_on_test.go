//go:build race

package main

// raceEnabled: the tests run under -race, so the binary they start does too.
const raceEnabled = true
