// Package lineproto is the wire of the signer processes: one JSON request
// and one JSON answer, each on a line of its own, over a unix socket. The
// receipt signer and the payer signer speak it with their own messages.
package lineproto

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Call dials the unix socket at path, sends req as one JSON line and reads
// one answer line of at most max bytes into resp. label names the peer in
// errors ("signer /run/haia/signer.sock"). The context bounds the whole
// exchange: a peer that does not answer in time is an error wrapping
// context.DeadlineExceeded.
func Call(ctx context.Context, label, path string, max int, req, resp any) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return fmt.Errorf("%s: %w", label, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	b, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("%s: %w", label, err)
	}
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("%s: send: %w", label, err)
	}
	line, err := bufio.NewReaderSize(io.LimitReader(conn, int64(max)), max).ReadSlice('\n')
	if err != nil {
		var ne net.Error
		if ctx.Err() != nil || (errors.As(err, &ne) && ne.Timeout()) {
			return fmt.Errorf("%s: no answer in time: %w", label, context.DeadlineExceeded)
		}
		return fmt.Errorf("%s: receive: %w", label, err)
	}
	if err := json.Unmarshal(line, resp); err != nil {
		return fmt.Errorf("%s: answer is not JSON: %w", label, err)
	}
	return nil
}

// Serve accepts connections on ln and hands each to handle on a goroutine of
// its own until ctx is done; then it closes ln, waits for the connections in
// progress and returns nil. name names the server in its log and errors
// ("signer", "payer signer"). An accept that times out is retried; any other
// accept error ends serving with that error.
func Serve(ctx context.Context, ln net.Listener, name string, log *slog.Logger, handle func(context.Context, net.Conn)) error {
	var wg sync.WaitGroup
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				wg.Wait()
				log.Info(name + " stopped")
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			ln.Close()
			wg.Wait()
			return fmt.Errorf("%s: accept: %w", name, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			handle(ctx, conn)
		}()
	}
}
