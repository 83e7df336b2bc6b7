package noa

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jcs"
)

// Limits on what reading a chain may cost.
const (
	// MaxArrayBytes bounds a chain in the NOA JSON-array form.
	MaxArrayBytes = 64 << 20
	// MaxLineBytes bounds one receipt line of a chain file.
	MaxLineBytes = 1 << 20
	// MaxReceipts bounds the receipts of a chain decoded whole (the array
	// form, ReadChain, VerifyChain); a chain file verified as a stream
	// (VerifyStream, VerifySegments) has no such bound.
	MaxReceipts = 1_000_000
)

// Form is how a chain was written.
type Form int

const (
	// FormArray is NOA's form: one JSON array of receipts, in any order
	// (verification orders them by seq).
	FormArray Form = iota
	// FormLines is this product's chain file: one receipt per line,
	// appended in seq order.
	FormLines
)

// ReadChain reads a chain in either form; see DecodeChain.
func ReadChain(r io.Reader) ([]Receipt, error) {
	rs, _, err := DecodeChain(r)
	return rs, err
}

// DecodeChain reads a chain: the NOA JSON-array form when the first
// non-blank byte is '[', else one receipt per line. In the line form the
// text after the last newline is a torn write and is dropped, blank lines
// and "\r\n" endings are accepted, and every other line must be a valid
// receipt. Every receipt is decoded strictly (ParseReceipt); an error
// names the element or line. An empty input gives no receipts and no
// error (a chain not yet started).
func DecodeChain(r io.Reader) ([]Receipt, Form, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	form, err := sniffForm(br)
	if err != nil {
		return nil, form, err
	}
	if form == FormArray {
		rs, err := decodeArray(br)
		return rs, FormArray, err
	}
	rs, err := decodeLines(br)
	return rs, FormLines, err
}

// sniffForm skips leading blanks and tells the form by the first other
// byte: '[' is the array form, anything else (or nothing) the line form.
func sniffForm(br *bufio.Reader) (Form, error) {
	for {
		b, err := br.Peek(1)
		if err == io.EOF {
			return FormLines, nil
		}
		if err != nil {
			return FormLines, fmt.Errorf("reading chain: %w", err)
		}
		switch b[0] {
		case ' ', '\t', '\r', '\n':
			br.ReadByte()
		case '[':
			return FormArray, nil
		default:
			return FormLines, nil
		}
	}
}

func decodeArray(r io.Reader) ([]Receipt, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxArrayBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading chain: %w", err)
	}
	if len(data) > MaxArrayBytes {
		return nil, fmt.Errorf("chain: larger than %d bytes", MaxArrayBytes)
	}
	v, err := jcs.ParseLimit(data, MaxArrayBytes)
	if err != nil {
		return nil, fmt.Errorf("chain: %w", err)
	}
	arr, ok := v.([]any)
	if !ok {
		return nil, errors.New("chain: not an array of receipts")
	}
	if len(arr) > MaxReceipts {
		return nil, fmt.Errorf("chain: more than %d receipts", MaxReceipts)
	}
	rs := make([]Receipt, 0, len(arr))
	for i, e := range arr {
		rc, err := receiptFromTree(e)
		if err != nil {
			return nil, fmt.Errorf("receipt[%d]: %w", i, err)
		}
		rs = append(rs, rc)
	}
	return rs, nil
}

// decodeLines reads a whole chain in the line form into memory; at most
// MaxReceipts receipts (VerifyStream has no such limit).
func decodeLines(r io.Reader) ([]Receipt, error) {
	var rs []Receipt
	lr := NewLineReader(r)
	for {
		rc, err := lr.Next()
		if err == io.EOF {
			return rs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(rs) >= MaxReceipts {
			return nil, fmt.Errorf("chain: more than %d receipts", MaxReceipts)
		}
		rs = append(rs, rc)
	}
}

// ExportArray writes receipts in the NOA JSON-array form that other
// verifiers read: one canonical receipt per line inside "[" and "]".
func ExportArray(rs []Receipt) ([]byte, error) {
	out := []byte("[\n")
	for i, r := range rs {
		b, err := r.Bytes()
		if err != nil {
			return nil, fmt.Errorf("receipt %d: %w", i, err)
		}
		out = append(out, b...)
		if i < len(rs)-1 {
			out = append(out, ',')
		}
		out = append(out, '\n')
	}
	return append(out, "]\n"...), nil
}
