package lineproto

import (
	"bufio"
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serve answers every connection of a fresh unix socket with answer(line).
func serve(t *testing.T, answer func(line string) string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				if a := answer(line); a != "" {
					c.Write([]byte(a))
				}
				time.Sleep(200 * time.Millisecond)
			}()
		}
	}()
	return path
}

func TestCall(t *testing.T) {
	type msg struct {
		Op string `json:"op"`
	}
	cases := []struct {
		name, answer string
		timeout      time.Duration
		want         string // error substring; "" means success
	}{
		{"echo", `{"op":"pong"}` + "\n", time.Second, ""},
		{"not JSON", "nope\n", time.Second, "peer: answer is not JSON"},
		{"silent", "", 50 * time.Millisecond, "peer: no answer in time"},
		{"too long", strings.Repeat("x", 100) + "\n", time.Second, "peer: receive"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seen := make(chan string, 1)
			path := serve(t, func(line string) string { seen <- line; return c.answer })
			ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
			defer cancel()
			var resp msg
			err := Call(ctx, "peer", path, 64, msg{Op: "ping"}, &resp)
			if c.want == "" {
				if got := <-seen; err != nil || resp.Op != "pong" || got != `{"op":"ping"}`+"\n" {
					t.Fatalf("err %v, resp %+v, request seen %q", err, resp, got)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want it to contain %q", err, c.want)
			}
			if c.name == "silent" && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a silent peer's error does not wrap DeadlineExceeded: %v", err)
			}
		})
	}
	if err := Call(context.Background(), "peer", filepath.Join(t.TempDir(), "none.sock"), 64, msg{}, &msg{}); err == nil || !strings.HasPrefix(err.Error(), "peer: ") {
		t.Fatalf("no socket: %v", err)
	}
}
