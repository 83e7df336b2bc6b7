// Command pgcount is a loopback proxy in front of a PostgreSQL server that
// counts what its clients send: statements executed and round trips waited
// for, read from the frontend side of the wire protocol, so any client (any
// build of haia-trace-mcp) is counted alike without a tracer of its own.
//
//	pgcount --upstream 127.0.0.1:5432
//
// It prints "proxy ADDR counts URL" on its first line of output, then proxies
// every connection to ADDR to the upstream; GET URL answers "statements N
// round_trips M connections C prepares P" so far. A simple query ('Q') is one
// statement and one round trip; in the extended protocol each Execute ('E')
// is a statement and each Sync ('S') a round trip (a batch of n statements
// is n statements and one round trip, as pgx's tracer counts them). A round
// trip that executes nothing is also counted among the prepares: a client
// preparing statements it has not run on that connection yet (pgx does so
// once per connection and statement text, before the batch that first
// runs it). SSL and
// GSSAPI encryption requests are declined by the proxy itself, so the
// stream stays readable: give clients sslmode=disable or prefer.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pgcount:", err)
		os.Exit(1)
	}
}

// counts are the totals over every connection.
type counts struct {
	statements, roundTrips, connections, prepares atomic.Int64
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("pgcount", flag.ContinueOnError)
	upstream := fs.String("upstream", "127.0.0.1:5432", "the PostgreSQL server's host:port")
	listen := fs.String("listen", "127.0.0.1:0", "where clients connect (loopback)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	proxy, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen for clients on %s: %w", *listen, err)
	}
	stats, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		proxy.Close()
		return fmt.Errorf("listen for the counts: %w", err)
	}
	var c counts
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "statements %d round_trips %d connections %d prepares %d\n", c.statements.Load(), c.roundTrips.Load(), c.connections.Load(), c.prepares.Load())
	})}
	go srv.Serve(stats)
	go func() {
		<-ctx.Done()
		proxy.Close()
		srv.Close()
	}()
	fmt.Fprintf(stdout, "proxy %s counts http://%s/\n", proxy.Addr(), stats.Addr())
	for {
		conn, err := proxy.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		c.connections.Add(1)
		go func() {
			if err := serve(ctx, conn, *upstream, &c); err != nil {
				logger.Debug("connection ended", "err", err)
			}
		}()
	}
}

// The untyped requests a client may send before its startup message.
const (
	sslRequest    = 80877103
	gssEncRequest = 80877104
	cancelRequest = 80877102
	maxStartup    = 10000 // bytes; PostgreSQL's own limit
)

// serve proxies one client connection, counting what it sends once its
// startup is done.
func serve(ctx context.Context, client net.Conn, upstream string, c *counts) error {
	defer client.Close()
	var d net.Dialer
	server, err := d.DialContext(ctx, "tcp", upstream)
	if err != nil {
		return fmt.Errorf("dial %s: %w", upstream, err)
	}
	defer server.Close()
	// Untyped packets: an encryption request is declined here ('N'), any
	// other (the startup message, a cancel request) goes on and ends
	// this phase.
	for {
		var head [8]byte
		if _, err := io.ReadFull(client, head[:]); err != nil {
			return fmt.Errorf("read a startup packet: %w", err)
		}
		n, code := binary.BigEndian.Uint32(head[:4]), binary.BigEndian.Uint32(head[4:])
		if n < 8 || n > maxStartup {
			return fmt.Errorf("a startup packet of %d bytes", n)
		}
		if code == sslRequest || code == gssEncRequest {
			if n != 8 {
				return fmt.Errorf("an encryption request of %d bytes", n)
			}
			if _, err := client.Write([]byte{'N'}); err != nil {
				return err
			}
			continue
		}
		body := make([]byte, n-8)
		if _, err := io.ReadFull(client, body); err != nil {
			return fmt.Errorf("read the startup packet: %w", err)
		}
		if _, err := server.Write(append(head[:], body...)); err != nil {
			return err
		}
		break
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(client, server)
		client.Close()
		done <- err
	}()
	var f frontend
	buf := make([]byte, 64<<10)
	for {
		n, rerr := client.Read(buf)
		if n > 0 {
			if err := f.feed(buf[:n]); err != nil {
				server.Close()
				return err
			}
			c.statements.Add(f.statements)
			c.roundTrips.Add(f.roundTrips)
			c.prepares.Add(f.prepares)
			f.statements, f.roundTrips, f.prepares = 0, 0, 0
			if _, err := server.Write(buf[:n]); err != nil {
				return err
			}
		}
		if rerr != nil {
			server.Close()
			<-done
			if errors.Is(rerr, io.EOF) {
				return nil
			}
			return rerr
		}
	}
}

// frontend follows the typed messages a client sends after its startup (a
// type byte, then a 4-byte length that counts itself and the body) across
// reads of any size, counting statements and round trips.
type frontend struct {
	head                   [5]byte
	have                   int    // bytes of head read
	skip                   uint32 // body bytes of the current message left
	statements, roundTrips int64
	// prepares are the round trips (Syncs) that ran no Execute since the
	// one before; sinceSync counts the Executes since the last Sync.
	prepares, sinceSync int64
}

func (f *frontend) feed(p []byte) error {
	for len(p) > 0 {
		if f.skip > 0 {
			k := min(uint32(len(p)), f.skip)
			f.skip -= k
			p = p[k:]
			continue
		}
		k := copy(f.head[f.have:], p)
		f.have += k
		p = p[k:]
		if f.have < len(f.head) {
			return nil
		}
		f.have = 0
		n := binary.BigEndian.Uint32(f.head[1:])
		if n < 4 {
			return fmt.Errorf("a %q message of length %d (at least 4)", f.head[0], n)
		}
		f.skip = n - 4
		switch f.head[0] {
		case 'Q':
			f.statements++
			f.roundTrips++
		case 'E':
			f.statements++
			f.sinceSync++
		case 'S':
			f.roundTrips++
			if f.sinceSync == 0 {
				f.prepares++
			}
			f.sinceSync = 0
		}
	}
	return nil
}
