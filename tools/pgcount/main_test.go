package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
)

// msg is one frontend message: its type, then its length and body.
func msg(typ byte, body string) []byte {
	b := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(4+len(body)))
	return append(b, body...)
}

func TestFrontendCounts(t *testing.T) {
	join := func(ms ...[]byte) []byte {
		var out []byte
		for _, m := range ms {
			out = append(out, m...)
		}
		return out
	}
	for _, c := range []struct {
		name             string
		stream           []byte
		statements, trip int64
		prepares         int64
		bad              bool
	}{
		{"a simple query", msg('Q', "SELECT 1\x00"), 1, 1, 0, false},
		{"one extended statement", join(msg('B', "xx"), msg('E', "\x00\x00\x00\x00\x00"), msg('S', "")), 1, 1, 0, false},
		{"a batch of three", join(msg('B', ""), msg('E', ""), msg('B', ""), msg('E', ""), msg('B', ""), msg('E', ""), msg('S', "")), 3, 1, 0, false},
		{"a preparation", join(msg('P', "s\x00SELECT 1\x00\x00\x00"), msg('D', "Ss\x00"), msg('S', "")), 0, 1, 1, false},
		{"two statements prepared, then run in a batch", join(msg('P', "a\x00SELECT 1\x00\x00\x00"), msg('D', "Sa\x00"), msg('P', "b\x00SELECT 2\x00\x00\x00"), msg('D', "Sb\x00"), msg('S', ""),
			msg('B', ""), msg('E', ""), msg('B', ""), msg('E', ""), msg('S', "")), 2, 2, 1, false},
		{"terminate", msg('X', ""), 0, 0, 0, false},
		{"a length under 4", []byte{'Q', 0, 0, 0, 3}, 0, 0, 0, true},
		{"a body of 1 MiB", join(msg('Q', strings.Repeat("x", 1<<20))), 1, 1, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Whole, and one byte a read: the same counts.
			for _, size := range []int{len(c.stream), 1} {
				var f frontend
				var err error
				for p := c.stream; len(p) > 0 && err == nil; p = p[min(size, len(p)):] {
					err = f.feed(p[:min(size, len(p))])
				}
				if (err != nil) != c.bad {
					t.Fatalf("reads of %d bytes: err %v, want failure %v", size, err, c.bad)
				}
				if !c.bad && (f.statements != c.statements || f.roundTrips != c.trip || f.prepares != c.prepares) {
					t.Errorf("reads of %d bytes: %d statements, %d round trips, %d prepares; want %d, %d, %d", size, f.statements, f.roundTrips, f.prepares, c.statements, c.trip, c.prepares)
				}
			}
		})
	}
}

// FuzzFrontend: any bytes, read whole or in pieces, give the same counts
// or the same refusal, and never a panic.
func FuzzFrontend(f *testing.F) {
	f.Add(msg('Q', "SELECT 1\x00"), uint8(3))
	f.Add(append(msg('E', ""), msg('S', "")...), uint8(1))
	f.Add([]byte{'S', 0, 0, 0, 2}, uint8(2))
	f.Fuzz(func(t *testing.T, stream []byte, size uint8) {
		var whole, pieces frontend
		werr := whole.feed(stream)
		step := int(size%16) + 1
		var perr error
		for p := stream; len(p) > 0 && perr == nil; p = p[min(step, len(p)):] {
			perr = pieces.feed(p[:min(step, len(p))])
		}
		if (werr != nil) != (perr != nil) {
			t.Fatalf("whole: %v, in pieces of %d: %v", werr, step, perr)
		}
		if werr == nil && (whole.statements != pieces.statements || whole.roundTrips != pieces.roundTrips || whole.prepares != pieces.prepares) {
			t.Fatalf("whole %d/%d/%d, in pieces %d/%d/%d", whole.statements, whole.roundTrips, whole.prepares, pieces.statements, pieces.roundTrips, pieces.prepares)
		}
		if whole.prepares > whole.roundTrips {
			t.Fatalf("%d prepares in %d round trips", whole.prepares, whole.roundTrips)
		}
	})
}

// Through the real proxy to the real PostgreSQL with pgx (sslmode=prefer,
// so the proxy declines its SSL request): a cached statement is one
// statement and one round trip, a batch of three cached statements three
// and one, and a batch of a statement the connection has not run yet a
// round trip more, counted among the prepares.
func TestProxyCountsPgx(t *testing.T) {
	dsn := pgtest.DSN(t)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"--upstream", cfg.Host + ":" + strconv.Itoa(int(cfg.Port))}, pw)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("pgcount: %v", err)
		}
	})
	first, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	var proxyAddr, statsURL string
	if _, err := fmt.Sscanf(first, "proxy %s counts %s", &proxyAddr, &statsURL); err != nil {
		t.Fatalf("first line %q: %v", first, err)
	}
	var prep int64
	get := func() (st, rt int64) {
		t.Helper()
		resp, err := http.Get(statsURL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var conns int64
		if _, err := fmt.Fscanf(resp.Body, "statements %d round_trips %d connections %d prepares %d", &st, &rt, &conns, &prep); err != nil {
			t.Fatal(err)
		}
		return st, rt
	}
	host, port, err := net.SplitHostPort(proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	// sslmode=prefer: an SSL request first, declined by the proxy, then
	// the plain fallback, every one through the proxy.
	pcfg, err := pgx.ParseConfig(strings.Replace(dsn, "sslmode=disable", "sslmode=prefer", 1))
	if err != nil {
		t.Fatal(err)
	}
	if pcfg.TLSConfig == nil {
		t.Fatal("sslmode=prefer gave no TLS configuration")
	}
	pcfg.Host, pcfg.Port = host, uint16(p)
	for _, fb := range pcfg.Fallbacks {
		fb.Host, fb.Port = host, uint16(p)
	}
	cctx, ccancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer ccancel()
	conn, err := pgx.ConnectConfig(cctx, pcfg)
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	defer conn.Close(context.Background())
	var v int
	if err := conn.QueryRow(cctx, "SELECT $1::int", 1).Scan(&v); err != nil { // prepares, then runs
		t.Fatal(err)
	}
	st0, rt0 := get()
	if err := conn.QueryRow(cctx, "SELECT $1::int", 2).Scan(&v); err != nil || v != 2 {
		t.Fatalf("query: %v %d", err, v)
	}
	st1, rt1 := get()
	if st1-st0 != 1 || rt1-rt0 != 1 {
		t.Errorf("one cached statement: %d statements, %d round trips", st1-st0, rt1-rt0)
	}
	b := &pgx.Batch{}
	for i := range 3 {
		b.Queue("SELECT $1::int", i)
	}
	if err := conn.SendBatch(cctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	st2, rt2 := get()
	if st2-st1 != 3 || rt2-rt1 != 1 {
		t.Errorf("a batch of three: %d statements, %d round trips", st2-st1, rt2-rt1)
	}
	prep2 := prep
	b = &pgx.Batch{}
	b.Queue("SELECT $1::int + 1", 1)
	b.Queue("SELECT $1::int", 1)
	if err := conn.SendBatch(cctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	st3, rt3 := get()
	if st3-st2 != 2 || rt3-rt2 != 2 || prep-prep2 != 1 {
		t.Errorf("a batch with a new statement: %d statements, %d round trips, %d prepares; want 2, 2, 1", st3-st2, rt3-rt2, prep-prep2)
	}
}
