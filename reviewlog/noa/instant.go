package noa

import (
	"fmt"
	"regexp"
	"strconv"
	"time"
)

// instantRE is the RFC 3339 shape NOA accepts (lowercase t/z included).
var instantRE = regexp.MustCompile(`^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|([+-])(\d{2}):(\d{2}))$`)

// checkInstant accepts a timestamp only when it denotes a real instant:
// month 01–12, a day that exists in that month of that year, hour ≤ 23,
// minute ≤ 59, second ≤ 60 (a leap second is accepted), offset ≤ 23:59.
// A pattern alone would let "2026-13-45T99:99:99Z" through.
func checkInstant(s string) error {
	_, err := parseInstant(s)
	return err
}

// parseInstant returns the instant s denotes (a leap second counts as the
// last moment of its minute, which is all ordering needs).
func parseInstant(s string) (time.Time, error) {
	m := instantRE.FindStringSubmatch(s)
	if m == nil {
		return time.Time{}, fmt.Errorf("%q is not an RFC 3339 timestamp (YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM))", s)
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	year, month, day, hour, minute, sec := n(1), n(2), n(3), n(4), n(5), n(6)
	if month < 1 || month > 12 {
		return time.Time{}, fmt.Errorf("%q: month %02d does not exist", s, month)
	}
	// Day 0 of the next month is the last day of this one.
	last := time.Date(year, time.Month(month)+1, 0, 0, 0, 0, 0, time.UTC).Day()
	if day < 1 || day > last {
		return time.Time{}, fmt.Errorf("%q: day %02d does not exist in %04d-%02d", s, day, year, month)
	}
	if hour > 23 || minute > 59 || sec > 60 {
		return time.Time{}, fmt.Errorf("%q: time of day %02d:%02d:%02d does not exist", s, hour, minute, sec)
	}
	offset := 0
	if m[9] != "" {
		oh, om := n(10), n(11)
		if oh > 23 || om > 59 {
			return time.Time{}, fmt.Errorf("%q: offset %s%02d:%02d does not exist", s, m[9], oh, om)
		}
		offset = (oh*60 + om) * 60
		if m[9] == "-" {
			offset = -offset
		}
	}
	nanos := 0
	if m[7] != "" {
		frac := m[7][1:]
		for len(frac) < 9 {
			frac += "0"
		}
		nanos, _ = strconv.Atoi(frac)
	}
	leap := sec == 60
	if leap {
		sec, nanos = 59, 999999999
	}
	return time.Date(year, time.Month(month), day, hour, minute, sec, nanos, time.FixedZone("", offset)), nil
}

// FormatTS writes t the way this product stamps receipts: UTC with
// milliseconds ("2026-07-24T09:00:00.120Z").
func FormatTS(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}
