package noa

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// splitArray cuts a JSON array's text into the raw text of its top-level
// elements, each on one line (whitespace outside strings folded), without
// judging the elements: what the strict decoder would refuse stays in.
// ok is false when the text is not "[ e, e, ... ]" at the top level.
func splitArray(data []byte) (elems [][]byte, ok bool) {
	data = bytes.TrimSpace(data)
	if len(data) < 2 || data[0] != '[' || data[len(data)-1] != ']' {
		return nil, false
	}
	body := data[1 : len(data)-1]
	var cur []byte
	depth, inStr, esc := 0, false, false
	for _, c := range body {
		switch {
		case inStr:
			cur = append(cur, c)
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		case c == '"':
			inStr = true
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
			if depth < 0 {
				return nil, false
			}
		case c == ',' && depth == 0:
			elems = append(elems, bytes.TrimSpace(cur))
			cur = nil
			continue
		case c == '\n' || c == '\r' || c == '\t':
			c = ' '
		}
		cur = append(cur, c)
	}
	if depth != 0 || inStr {
		return nil, false
	}
	if t := bytes.TrimSpace(cur); len(t) > 0 {
		elems = append(elems, t)
	}
	return elems, true
}

// TestStreamConformanceVectors gives every vector of the conformance table
// to the streaming verifier in this product's line form (the vectors are
// all in seq order), expecting the reference verifier's exit code.
func TestStreamConformanceVectors(t *testing.T) {
	dir := sharedNOA(t)
	base := filepath.Join(dir, "conformance")
	streamed := 0
	for _, row := range readConformance(t, dir) {
		t.Run(strconv.Itoa(row.line)+"_"+strings.Join(row.args, "_"), func(t *testing.T) {
			d := documentsFor(t, base, row.args)
			arr, _ := io.ReadAll(d.Chain)
			elems, ok := splitArray(arr)
			if !ok {
				t.Skipf("not an array at the top level (the array form's own test covers it)")
			}
			d.Chain = bytes.NewReader(append(bytes.Join(elems, []byte("\n")), '\n'))
			res := VerifyDocuments(d)
			if got := res.Verdict.ExitCode(); got != row.exit {
				t.Fatalf("line form: exit %d (%s), want %d", got, res.Line(), row.exit)
			}
			streamed++
		})
	}
	if streamed < 40 {
		t.Fatalf("only %d vectors went through the stream", streamed)
	}
}

// verdictsAgree checks the stream against the whole-file verifier on the
// same chain file.
func verdictsAgree(t *testing.T, file []byte, opt Options) Result {
	t.Helper()
	want := Result{Verdict: Malformed}
	rs, form, err := DecodeChain(bytes.NewReader(file))
	if err == nil && form == FormLines {
		o := opt
		o.InFileOrder = true
		want = VerifyChain(rs, o)
	} else if form == FormArray {
		return want
	}
	got := VerifyStream(bytes.NewReader(file), opt)
	if got.Verdict != want.Verdict || (got.Verdict == Valid && (got.Count != want.Count || got.Head != want.Head)) {
		t.Fatalf("stream %s, whole file %s", got.Line(), want.Line())
	}
	return got
}

func TestStreamMatchesWholeFile(t *testing.T) {
	s := NewKeySigner(newKey(t))
	other := NewKeySigner(newKey(t))
	_, file := sealChain(t, s, 6)
	ls := lines(file)
	kr := keyringFor(s)
	// A receipt of another chain partition, signed and valid on its own.
	foreignDraft := testDraft(0)
	foreignDraft.Chain = "elsewhere"
	_, foreign, err := Seal(context.Background(), foreignDraft, nil, s)
	if err != nil {
		t.Fatal(err)
	}
	_, otherFile := sealChain(t, other, 2)
	tampered := bytes.Replace(ls[1], []byte(`"by":"alice"`), []byte(`"by":"mallory"`), 1)
	otherTenant := bytes.Replace(ls[4], []byte(`"tenant":"ops"`), []byte(`"tenant":"dev"`), 1)

	cases := map[string][]byte{
		"intact":                            file,
		"torn tail":                         append(bytes.Clone(file), `{"spec`...),
		"empty":                             nil,
		"blank lines only":                  []byte("\n\n"),
		"swapped":                           join([][]byte{ls[0], ls[2], ls[1], ls[3]}),
		"duplicate":                         join([][]byte{ls[0], ls[1], ls[1]}),
		"gap":                               join([][]byte{ls[0], ls[2]}),
		"no genesis":                        join(ls[1:]),
		"edited":                            join([][]byte{ls[0], tampered, ls[2]}),
		"edited, then a malformed line":     join([][]byte{ls[0], tampered, ls[2], []byte(`{"a":1}`)}),
		"edited, then another partition":    join([][]byte{ls[0], tampered, ls[2], foreign}),
		"edited, then the tenant changes":   join([][]byte{ls[0], tampered, ls[2], ls[3], otherTenant}),
		"another partition":                 join([][]byte{ls[0], foreign}),
		"another key's chain spliced":       join([][]byte{ls[0], lines(otherFile)[1]}),
		"malformed first line":              join([][]byte{[]byte("{"), ls[0]}),
		"a line over the limit":             join([][]byte{ls[0], []byte(strings.Repeat(" ", MaxLineBytes+8)), ls[1]}),
		"crlf":                              bytes.ReplaceAll(file, []byte("\n"), []byte("\r\n")),
		"unknown key, then malformed later": join([][]byte{lines(otherFile)[0], []byte("[]")}),
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			for _, opt := range []Options{{Keyring: kr}, {}, {Keyring: Keyring{}}, {Keyring: kr, Identity: Identity{"agent-buyer": {s.KeyID()}}}} {
				verdictsAgree(t, in, opt)
			}
		})
	}
}

// TestStreamMatchesWholeFileEdited compares the two on many files with a
// few bytes or lines changed (a fixed seed, so failures repeat).
func TestStreamMatchesWholeFileEdited(t *testing.T) {
	s := NewKeySigner(newKey(t))
	_, file := sealChain(t, s, 5)
	ls := lines(file)
	kr := keyringFor(s)
	rng := rand.New(rand.NewPCG(14, 4))
	alphabet := []byte("{}[],:\"\\\n 0123456789abcdefnulltrue-")
	for i := range 300 {
		in := bytes.Clone(file)
		switch i % 3 {
		case 0: // a few bytes changed
			for range 1 + rng.IntN(3) {
				in[rng.IntN(len(in))] = alphabet[rng.IntN(len(alphabet))]
			}
		case 1: // lines dropped, repeated or moved
			var out [][]byte
			for range 1 + rng.IntN(len(ls)+2) {
				out = append(out, ls[rng.IntN(len(ls))])
			}
			in = join(out)
		case 2: // a line cut short somewhere
			j := rng.IntN(len(ls))
			l := ls[j][:rng.IntN(len(ls[j]))]
			in = join(append(append(append([][]byte{}, ls[:j]...), l), ls[j+1:]...))
		}
		verdictsAgree(t, in, Options{Keyring: kr})
	}
}

func FuzzStreamMatchesWholeFile(f *testing.F) {
	s := NewKeySigner(newKey(f))
	_, file := sealChain(f, s, 4)
	ls := lines(file)
	f.Add(file)
	f.Add(join([][]byte{ls[0], ls[2], ls[1]}))
	f.Add(join([][]byte{ls[0], ls[1], []byte("{}")}))
	f.Add(bytes.Replace(file, []byte(`"tenant":"ops"`), []byte(`"tenant":"x"`), 1))
	kr := keyringFor(s)
	f.Fuzz(func(t *testing.T, data []byte) {
		verdictsAgree(t, data, Options{Keyring: kr})
	})
}

func TestStreamBoundsItsWarnings(t *testing.T) {
	s := NewKeySigner(newKey(t))
	var file []byte
	var prev *Receipt
	for i := range 40 {
		d := testDraft(0)
		d.TS = t0.Add(time.Duration(-i) * time.Minute) // every receipt goes back in time
		r, line, err := Seal(context.Background(), d, prev, s)
		if err != nil {
			t.Fatal(err)
		}
		prev = &r
		file = append(file, line...)
	}
	res := VerifyStream(bytes.NewReader(file), Options{Keyring: keyringFor(s)})
	ts := 0
	for _, w := range res.Warnings {
		if strings.Contains(w, "non-monotonic") {
			ts++
		}
	}
	if res.Verdict != Valid || ts != maxTSWarnings+1 || !strings.Contains(strings.Join(res.Warnings, "\n"), "29"+warnMoreTS) {
		t.Fatalf("%s: %d timestamp warnings: %q", res.Line(), ts, res.Warnings)
	}
}

func TestLineReaderAndExportStream(t *testing.T) {
	s := NewKeySigner(newKey(t))
	rs, file := sealChain(t, s, 3)
	in := append([]byte("\n"), bytes.ReplaceAll(file, []byte("\n"), []byte("\r\n\n"))...)
	in = append(in, `{"torn`...)
	lr := NewLineReader(bytes.NewReader(in))
	for i := range rs {
		r, err := lr.Next()
		if err != nil {
			t.Fatalf("receipt %d: %v", i, err)
		}
		if r.ID != rs[i].ID || !bytes.HasPrefix(in[lr.Offset():], []byte(`{"action"`)) {
			t.Fatalf("receipt %d: id %s at offset %d", i, r.ID, lr.Offset())
		}
	}
	if _, err := lr.Next(); err != io.EOF {
		t.Fatalf("after the last line: %v", err)
	}
	if lr.End() != int64(len(in)-len(`{"torn`)) {
		t.Fatalf("End %d, want where the torn tail starts (%d)", lr.End(), len(in)-len(`{"torn`))
	}

	want, err := ExportArray(rs)
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	n, err := ExportStream(&got, bytes.NewReader(in))
	if err != nil || n != 3 || !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("ExportStream: %d %v\n%s\nwant\n%s", n, err, got.Bytes(), want)
	}
	got.Reset()
	if _, err := ExportStream(&got, strings.NewReader("{}\n")); err == nil || !strings.Contains(err.Error(), "chain line 1") {
		t.Fatalf("a bad line: %v", err)
	}
}

// BenchmarkVerifyStream is the cost of verifying one receipt of a chain
// file as a stream.
func BenchmarkVerifyStream(b *testing.B) {
	s := NewKeySigner(newKey(b))
	_, file := sealChain(b, s, 1000)
	opt := Options{Keyring: keyringFor(s)}
	b.SetBytes(int64(len(file)) / 1000)
	b.ResetTimer()
	for range b.N / 1000 {
		if res := VerifyStream(bytes.NewReader(file), opt); res.Verdict != Valid {
			b.Fatal(res.Line())
		}
	}
}
