package noa

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/lineproto"
)

// The signer protocol: over a unix socket, one JSON object per line in
// each direction. Requests are {"op":"key"} and {"op":"sign","msg":B64};
// answers are {"kid":…,"pub":B64 SPKI}, {"sig":B64} or {"error":…}. The
// signer signs only NOA preimages (a receipt or checkpoint domain tag
// followed by a 32-byte digest), so a compromised client cannot make it
// sign anything else.

const (
	maxSignerLine   = 4 << 10
	signerIOTimeout = 10 * time.Second
)

type signerRequest struct {
	Op  string `json:"op"`
	Msg string `json:"msg,omitempty"`
}

type signerResponse struct {
	KID   string `json:"kid,omitempty"`
	Pub   string `json:"pub,omitempty"`
	Sig   string `json:"sig,omitempty"`
	Error string `json:"error,omitempty"`
}

// signable reports whether msg is a NOA preimage.
func signable(msg []byte) bool {
	for _, d := range []string{receiptDomain, checkpointDomain} {
		if len(msg) == len(d)+32 && bytes.HasPrefix(msg, []byte(d)) {
			return true
		}
	}
	return false
}

// ListenSigner listens on a unix socket at path, readable and writable by
// its owner only: the socket is created under a umask of 0177 (so it is
// never more open than 0600, not even for an instant) and then set to
// 0600. A stale socket nobody listens on is replaced; any other existing
// file is refused. Closing the listener removes the socket.
func ListenSigner(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("signer socket %s: a file that is not a socket is in the way", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("signer socket %s: another signer is listening there", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("signer socket %s: removing the stale socket: %w", path, err)
		}
	}
	// The umask is process-wide; narrowing it briefly can only make files
	// other goroutines create in that instant more private, never less.
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("signer socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("signer socket %s: chmod: %w", path, err)
	}
	return ln, nil
}

// ServeSigner answers signing requests on ln with key until ctx is done,
// then closes ln, waits for the connections in progress and returns nil.
func ServeSigner(ctx context.Context, ln net.Listener, key ed25519.PrivateKey, log *slog.Logger) error {
	pub := key.Public().(ed25519.PublicKey)
	kid := KeyID(pub)
	log.Info("signer ready", "kid", kid, "addr", ln.Addr().String())
	return lineproto.Serve(ctx, ln, "signer", log, func(ctx context.Context, conn net.Conn) {
		serveSignerConn(ctx, conn, key, kid, pub, log)
	})
}

func serveSignerConn(ctx context.Context, conn net.Conn, key ed25519.PrivateKey, kid string, pub ed25519.PublicKey, log *slog.Logger) {
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	br := bufio.NewReaderSize(conn, maxSignerLine)
	enc := json.NewEncoder(conn)
	for {
		conn.SetDeadline(time.Now().Add(signerIOTimeout))
		line, err := br.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				enc.Encode(signerResponse{Error: fmt.Sprintf("request longer than %d bytes", maxSignerLine)})
			}
			return
		}
		var req signerRequest
		var resp signerResponse
		if err := json.Unmarshal(line, &req); err != nil {
			resp.Error = "request is not a JSON object"
		} else {
			switch req.Op {
			case "key":
				resp.KID, resp.Pub = kid, EncodeSPKI(pub)
			case "sign":
				msg, err := base64.StdEncoding.DecodeString(req.Msg)
				if err != nil || !signable(msg) {
					resp.Error = "refused: only NOA receipt and checkpoint preimages are signed"
					log.Warn("signer refused a request", "reason", "not a NOA preimage")
				} else {
					resp.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(key, msg))
				}
			default:
				resp.Error = fmt.Sprintf("unknown op %q", req.Op)
			}
		}
		if err := enc.Encode(resp); err != nil {
			return
		}
	}
}

// RemoteSigner is the client side of a signer process.
type RemoteSigner struct {
	path    string
	timeout time.Duration
	kid     string
	pub     ed25519.PublicKey
}

// DialSigner connects to the signer at path (a unix socket) and fetches its
// public key. Every later Sign opens its own connection and gives up after
// timeout, so a stopped or hung signer yields an error, never a hang.
func DialSigner(path string, timeout time.Duration) (*RemoteSigner, error) {
	if timeout <= 0 {
		return nil, errors.New("signer: timeout must be positive")
	}
	s := &RemoteSigner{path: path, timeout: timeout}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := s.call(ctx, signerRequest{Op: "key"})
	if err != nil {
		return nil, err
	}
	pub, err := DecodeSPKI(resp.Pub)
	if err != nil {
		return nil, fmt.Errorf("signer %s: public key: %w", path, err)
	}
	if resp.KID != KeyID(pub) {
		return nil, fmt.Errorf("signer %s: kid %q does not match its public key", path, resp.KID)
	}
	s.kid, s.pub = resp.KID, pub
	return s, nil
}

func (s *RemoteSigner) KeyID() string                { return s.kid }
func (s *RemoteSigner) PublicKey() ed25519.PublicKey { return s.pub }

// Sign asks the signer process to sign msg and checks the answer.
func (s *RemoteSigner) Sign(ctx context.Context, msg []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	resp, err := s.call(ctx, signerRequest{Op: "sign", Msg: base64.StdEncoding.EncodeToString(msg)})
	if err != nil {
		return nil, err
	}
	sig, err := base64.StdEncoding.DecodeString(resp.Sig)
	if err != nil || len(sig) != ed25519.SignatureSize || !ed25519.Verify(s.pub, msg, sig) {
		return nil, fmt.Errorf("signer %s: answered with a signature that does not verify", s.path)
	}
	return sig, nil
}

func (s *RemoteSigner) call(ctx context.Context, req signerRequest) (signerResponse, error) {
	var resp signerResponse
	label := "signer " + s.path
	if err := lineproto.Call(ctx, label, s.path, maxSignerLine, req, &resp); err != nil {
		return signerResponse{}, err
	}
	if resp.Error != "" {
		return signerResponse{}, fmt.Errorf("%s: %s", label, resp.Error)
	}
	return resp, nil
}

// Ping asks the signer process for its key and checks it is still the key
// this client signs with: a readiness probe that signs nothing.
func (s *RemoteSigner) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	resp, err := s.call(ctx, signerRequest{Op: "key"})
	if err != nil {
		return err
	}
	if resp.KID != s.kid {
		return fmt.Errorf("signer %s now answers with key %q, not %q", s.path, resp.KID, s.kid)
	}
	return nil
}
