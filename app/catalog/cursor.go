package catalog

import (
	"bytes"
	"compress/flate"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"sync"
)

// MaxCursorBytes bounds a cursor's text; maxCursorJSON the JSON it inflates
// to (a cursor names every run of the first page with its length).
const (
	MaxCursorBytes = 256 << 10
	maxCursorJSON  = 4 << 20
)

// CursorKind says what is wrong with a cursor.
type CursorKind int

const (
	// CursorInvalid is a cursor the catalog did not write, or one cut short.
	CursorInvalid CursorKind = iota + 1
	// CursorOtherVersion is a cursor another version wrote.
	CursorOtherVersion
	// CursorOtherListing is a cursor of a listing with other arguments
	// (Template, Run and Completeness are that listing's).
	CursorOtherListing
)

// CursorError is a cursor List refuses.
type CursorError struct {
	Kind                        CursorKind
	Template, Run, Completeness string
}

func (e *CursorError) Error() string {
	switch e.Kind {
	case CursorOtherVersion:
		return "cursor was written by another version"
	case CursorOtherListing:
		return fmt.Sprintf("cursor belongs to a listing with other arguments (template %q, run %q, completeness %q)", e.Template, e.Run, e.Completeness)
	}
	return "cursor is not one a listing returned (or it was cut short)"
}

// listCursor is what a next-page cursor carries: the arguments of the
// listing, the last row returned, and the snapshot the first page was read
// at (each run with its line count then), so that later pages list every
// operation as it was then.
type listCursor struct {
	V            int      `json:"v"`
	Template     string   `json:"t"`
	RunSel       string   `json:"s,omitempty"`
	Completeness string   `json:"c,omitempty"`
	At           string   `json:"a"`
	Run          string   `json:"r"`
	Op           string   `json:"o"`
	Runs         []string `json:"rs"`
	Lines        []int    `json:"ls"`
}

const cursorVersion = 1

func (c *listCursor) snapshot() map[string]int {
	at := make(map[string]int, len(c.Runs))
	for i, id := range c.Runs {
		at[id] = c.Lines[i]
	}
	return at
}

// cursorCodec keeps deflate writers for reuse: a new one costs about a MiB,
// more than the rest of a listing.
type cursorCodec struct{ writers sync.Pool }

// encode deflates the cursor's JSON into unpadded base64url.
func (cc *cursorCodec) encode(c listCursor) string { return cc.encodeVersion(c, cursorVersion) }

// encodeVersion is encode as version v wrote it.
func (cc *cursorCodec) encodeVersion(c listCursor, v int) string {
	c.V = v
	js, err := json.Marshal(c)
	if err != nil {
		return "" // strings and ints always marshal
	}
	var b bytes.Buffer
	zw, _ := cc.writers.Get().(*flate.Writer)
	if zw == nil {
		zw, _ = flate.NewWriter(&b, flate.BestSpeed) // a valid level never fails
	} else {
		zw.Reset(&b)
	}
	_, _ = zw.Write(js) // a bytes.Buffer never fails
	_ = zw.Close()
	cc.writers.Put(zw)
	return base64.RawURLEncoding.EncodeToString(b.Bytes())
}

// decodeCursor reads a cursor back, refusing anything the catalog did not
// write.
func decodeCursor(s string) (*listCursor, error) {
	bad := &CursorError{Kind: CursorInvalid}
	if len(s) > MaxCursorBytes {
		return nil, bad
	}
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, bad
	}
	js, err := io.ReadAll(io.LimitReader(flate.NewReader(bytes.NewReader(raw)), maxCursorJSON+1))
	if err != nil || len(js) > maxCursorJSON {
		return nil, bad
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	var c listCursor
	if err := dec.Decode(&c); err != nil || dec.More() {
		return nil, bad
	}
	if c.V != cursorVersion {
		return nil, &CursorError{Kind: CursorOtherVersion}
	}
	if len(c.Runs) != len(c.Lines) || c.At == "" || c.Run == "" {
		return nil, bad
	}
	for _, n := range c.Lines {
		if n < 0 {
			return nil, bad
		}
	}
	return &c, nil
}
