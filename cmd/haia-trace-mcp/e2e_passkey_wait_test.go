package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
)

// seenRequest is one request a recordingProxy passed on.
type seenRequest struct {
	method, path, query string
	status              int
	start, end          time.Time
}

// recordingProxy stands between the console and everyone who reaches it
// (the operator's command, the reviewer's browser) at the address the
// console's URL names, and records every request and its answer.
type recordingProxy struct {
	mu   sync.Mutex
	seen []seenRequest
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// startRecordingProxy serves on 127.0.0.1:port and passes every request to
// target (host:port), Host kept.
func startRecordingProxy(t *testing.T, port, target string) *recordingProxy {
	t.Helper()
	rp := &recordingProxy{}
	fwd := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: target})
	srv := &http.Server{Addr: "127.0.0.1:" + port, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		start := time.Now()
		fwd.ServeHTTP(sw, r)
		rp.mu.Lock()
		rp.seen = append(rp.seen, seenRequest{method: r.Method, path: r.URL.Path, query: r.URL.RawQuery, status: sw.status, start: start, end: time.Now()})
		rp.mu.Unlock()
	})}
	ready := make(chan error, 1)
	go func() {
		ln, err := net.Listen("tcp", srv.Addr)
		ready <- err
		if err == nil {
			srv.Serve(ln)
		}
	}()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return rp
}

func (rp *recordingProxy) requests() []seenRequest {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	return append([]seenRequest(nil), rp.seen...)
}

// consoleBehindProxy starts the server with its console on a port of its
// own and a recording proxy at the port its URL names: the console's
// address, the proxy, the reviewers file and the server's key.
func consoleBehindProxy(t *testing.T) (base string, rp *recordingProxy, reviewers, key string) {
	t.Helper()
	root := loopRoot(t)
	reviewers = filepath.Join(t.TempDir(), "reviewers.json")
	key = filepath.Join(t.TempDir(), "signing.pem")
	real, front := freePort(t), freePort(t)
	base = "http://localhost:" + front + "/console/"
	var serverErr lockedBuffer
	mcpSession(t, &serverErr, "--dir", root, "--key-file", key, "--agent-id", "loop-agent", "--reviewers", reviewers,
		"--console", "--console-addr", "127.0.0.1:"+real, "--console-url", base)
	rp = startRecordingProxy(t, front, "127.0.0.1:"+real)
	return base, rp, reviewers, key
}

// A reviewer who takes three minutes on the page: `reviewer passkey add`
// (the real binary, against the real console) waits for them with a few
// held requests instead of asking every second, is never refused (no 429,
// for it or for the reviewer's page), and writes the passkey once the
// reviewer registers. The clock is the test hook's, ten times faster, so
// three minutes take eighteen seconds; the console's limits run in real
// time, so the command asks ten times as often as it would in use and
// still stays inside them.
func TestPasskeyAddWaitsForASlowReviewer(t *testing.T) {
	base, rp, reviewers, key := consoleBehindProxy(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const scale = 10
	en := startEnrolEnv(ctx, t, base, []string{"HAIA_TEST_TIME_SCALE=10"},
		"--id", "slow", "--console-url", base, "--reviewers", reviewers, "--key-file", key, "--yes", "--wait", "10m")
	token := en.link[strings.Index(en.link, "t=")+2:]
	a, _ := softauthn.New()
	b, err := softauthn.NewBrowser(base, a)
	if err != nil {
		t.Fatal(err)
	}
	if code, _, err := b.Get("enrol?t=" + token); err != nil || code != 200 {
		t.Fatalf("the reviewer opens the link: %d %v", code, err)
	}
	opened := time.Now()
	time.Sleep(3 * time.Minute / scale) // the reviewer reads, finds the authenticator, …
	registered := time.Now()
	if _, err := b.Enrol(strings.ReplaceAll(token, "%2F", "/")); err != nil {
		t.Fatalf("the reviewer registers after three minutes: %v", err)
	}
	if err := en.wait(); err != nil || !strings.Contains(en.out.String(), "(added") {
		t.Fatalf("passkey add: %v\n%s\n%s", err, en.out.String(), en.errb.String())
	}
	if !strings.Contains(en.errb.String(), "HAIA_TEST_TIME_SCALE=10: waiting 10 times faster") {
		t.Errorf("the test hook is not announced: %q", en.errb.String())
	}
	var collects, held int
	var last seenRequest
	for _, r := range rp.requests() {
		if r.status == http.StatusTooManyRequests {
			t.Errorf("%s %s?%s was refused with 429", r.method, r.path, r.query)
		}
		if r.status >= 400 {
			t.Errorf("%s %s?%s answered %d", r.method, r.path, r.query, r.status)
		}
		if !strings.HasSuffix(r.path, "/api/enrol/collect") || r.start.Before(opened) {
			continue
		}
		collects++
		last = r
		if r.status == http.StatusAccepted {
			if !strings.HasPrefix(r.query, "wait=") {
				t.Errorf("collect %q asks the console to hold nothing", r.query)
			}
			if r.end.Sub(r.start) >= time.Second {
				held++
			}
		}
	}
	// In use one request every 20 s: nine in three minutes. Allow a few
	// more for a slow machine; asking every second would be 18 here.
	if collects < 3 || collects > 12 || held < collects-3 {
		t.Errorf("%d collect requests while the reviewer took three minutes, %d of them held; want 3 to 12, nearly all held", collects, held)
	}
	if last.status != http.StatusOK || last.end.Sub(registered) > 5*time.Second {
		t.Errorf("the last collect answered %d %v after the registration; want the held one answering 200 at once", last.status, last.end.Sub(registered))
	}
	if data, err := os.ReadFile(reviewers); err != nil || !strings.Contains(string(data), a.CredentialID()) {
		t.Errorf("the reviewers file does not list the passkey: %v %s", err, data)
	}
}

// What can stop `reviewer passkey add` after the reviewer registers is
// checked before the link is issued: no terminal to confirm on (without
// --yes), a trusted reviewers file that cannot be read or written, a
// console URL other than the console's own. No link is printed, and the
// console is not asked to hold anything for it.
func TestPasskeyAddChecksBeforeTheLink(t *testing.T) {
	base, rp, reviewers, key := consoleBehindProxy(t)
	broken := filepath.Join(t.TempDir(), "broken.json")
	if err := os.WriteFile(broken, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	otherURL := strings.Replace(base, "localhost", "127.0.0.1", 1)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no terminal and no --yes", []string{"--console-url", base, "--reviewers", reviewers}, "no terminal to confirm the fingerprint on"},
		{"a reviewers file that does not read", []string{"--console-url", base, "--reviewers", broken, "--yes"}, "broken.json"},
		{"a reviewers file under a file", []string{"--console-url", base, "--reviewers", filepath.Join(notDir, "r.json"), "--yes"}, "not a directory"},
		{"another console URL", []string{"--console-url", otherURL, "--reviewers", reviewers, "--yes"}, "serves passkeys for http://localhost:"},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			before := len(rp.requests())
			out, errOut, code := runCLI(t, append([]string{"reviewer", "passkey", "add", "--id", "early", "--key-file", key, "--wait", "5s"}, tc.args...)...)
			if code != exitFail || strings.Contains(out, "enrol?t=") || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, "no link was issued") {
				t.Fatalf("exit %d\nstdout %s\nstderr %s\nwant exit 1, no link, %q", code, out, errOut, tc.want)
			}
			for _, r := range rp.requests()[before:] {
				if strings.Contains(r.query, "wait=") {
					t.Errorf("the console was asked to hold a collect (%s) for a link never issued", r.query)
				}
			}
		})
	}
	if _, err := os.Stat(reviewers); err == nil {
		t.Error("a refused enrolment wrote the reviewers file")
	}
}
