package pgstore

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func TestContiguous(t *testing.T) {
	rows := func(offs ...int64) []row {
		var out []row
		for _, o := range offs {
			out = append(out, row{off: o, line: []byte("0123456789")[:5]})
		}
		return out
	}
	for _, c := range []struct {
		name string
		rows []row
		from int64
		ok   bool
	}{
		{"one row", rows(0), 3, true},
		{"rows in a run", rows(10, 15, 20), 12, true},
		{"none", nil, 0, false},
		{"the first row after from", rows(10), 5, false},
		{"a gap", rows(0, 10), 2, false},
		{"an overlap", rows(0, 3), 2, false},
		{"the rows end before from", rows(0, 5), 12, false},
		{"a negative offset", rows(-5, 0), 0, false},
	} {
		start, buf, err := contiguous("s", c.rows, c.from)
		if (err == nil) != c.ok {
			t.Errorf("%s: start %d, %d bytes, %v; want ok=%v", c.name, start, len(buf), err, c.ok)
		}
	}
}

// FuzzContiguous: whatever rows a database writer leaves, contiguous never
// panics, and what it accepts holds offset from and is the rows' bytes in
// order.
func FuzzContiguous(f *testing.F) {
	f.Add([]byte{0, 5, 5, 5}, int64(3))
	f.Add([]byte{10, 5, 15, 5, 21, 5}, int64(12))
	f.Add([]byte{0, 5, 3, 5}, int64(2))
	f.Fuzz(func(t *testing.T, spec []byte, from int64) {
		var rs []row
		for i := 0; i+1 < len(spec); i += 2 {
			off := int64(int8(spec[i])) * 3
			if i+9 < len(spec) && spec[i+1] == 0xff {
				off = int64(binary.LittleEndian.Uint64(spec[i+2 : i+10]))
			}
			rs = append(rs, row{off: off, line: bytes.Repeat([]byte{'x'}, int(spec[i+1]%16))})
		}
		start, buf, err := contiguous("s", rs, from)
		if err != nil {
			return
		}
		if start > from || start+int64(len(buf)) <= from {
			t.Fatalf("accepted [%d, %d), which does not hold %d", start, start+int64(len(buf)), from)
		}
		var want []byte
		for _, r := range rs {
			want = append(want, r.line...)
		}
		if !bytes.Equal(buf, want) || start != rs[0].off {
			t.Fatalf("accepted bytes that are not the rows'")
		}
	})
}
