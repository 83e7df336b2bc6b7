package main

import (
	"testing"
	"time"
)

func TestParseSince(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"30d", 30 * 24 * time.Hour, true}, {"1d", 24 * time.Hour, true}, {"12h", 12 * time.Hour, true}, {"90m", 90 * time.Minute, true},
		{"0d", 0, false}, {"-3d", 0, false}, {"d", 0, false}, {"1.5d", 0, false}, {"36501d", 0, false}, {"-1h", 0, false}, {"soon", 0, false}, {"", 0, false},
	} {
		got, err := parseSince(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseSince(%q) = %v, %v; want %v, ok %v", c.in, got, err, c.want, c.ok)
		}
	}
}
