package noa

import (
	"bufio"
	"bytes"
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
	// MaxReceipts bounds the receipts of one chain.
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
	for {
		b, err := br.Peek(1)
		if err == io.EOF {
			return nil, FormLines, nil
		}
		if err != nil {
			return nil, FormLines, fmt.Errorf("reading chain: %w", err)
		}
		switch b[0] {
		case ' ', '\t', '\r', '\n':
			br.ReadByte()
			continue
		case '[':
			rs, err := decodeArray(br)
			return rs, FormArray, err
		default:
			rs, err := decodeLines(br)
			return rs, FormLines, err
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

func decodeLines(br *bufio.Reader) ([]Receipt, error) {
	var rs []Receipt
	var line []byte
	for n := 1; ; n++ {
		line = line[:0]
		complete := false
		for {
			chunk, err := br.ReadSlice('\n')
			if len(line)+len(chunk) > MaxLineBytes+2 {
				return nil, fmt.Errorf("chain line %d: longer than %d bytes", n, MaxLineBytes)
			}
			line = append(line, chunk...)
			if err == nil {
				complete = true
				break
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err == io.EOF {
				break
			}
			return nil, fmt.Errorf("reading chain line %d: %w", n, err)
		}
		if !complete {
			// The text after the last newline is never a whole record.
			return rs, nil
		}
		text := bytes.Trim(line, " \t\r\n")
		if len(text) == 0 {
			continue
		}
		if len(rs) >= MaxReceipts {
			return nil, fmt.Errorf("chain: more than %d receipts", MaxReceipts)
		}
		rc, err := ParseReceipt(text)
		if err != nil {
			return nil, fmt.Errorf("chain line %d: %w", n, err)
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
