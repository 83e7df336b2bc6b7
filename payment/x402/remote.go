package x402

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/lineproto"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/strictjson"
)

// The payer signer protocol: over a unix socket (see noa.ListenSigner for
// how it is created), one JSON object per line each way. Requests are
// {"op":"payer"} and {"op":"sign_authorization","domain":…,"authorization":…};
// answers are {"address":…}, {"signature":…} or {"error":…}. The signer
// computes the EIP-712 digest itself and signs only TransferWithAuthorization
// from its own address: a client cannot make it sign anything else.

const (
	maxPayerLine   = 4 << 10
	payerIOTimeout = 10 * time.Second
)

type domainJSON struct {
	Name              string `json:"name"`
	Version           string `json:"version"`
	ChainID           string `json:"chainId"`
	VerifyingContract string `json:"verifyingContract"`
}

type payerRequest struct {
	Op            string             `json:"op"`
	Domain        *domainJSON        `json:"domain,omitempty"`
	Authorization *AuthorizationJSON `json:"authorization,omitempty"`
}

type payerResponse struct {
	Address   string `json:"address,omitempty"`
	Signature string `json:"signature,omitempty"`
	Error     string `json:"error,omitempty"`
}

func uintField(name, s string) (*big.Int, error) {
	n, err := ParseAtomic(s)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return n, nil
}

func (d domainJSON) read() (Domain, error) {
	cid, err := uintField("chainId", d.ChainID)
	if err != nil {
		return Domain{}, err
	}
	vc, err := ParseAddress(d.VerifyingContract)
	if err != nil {
		return Domain{}, fmt.Errorf("verifyingContract: %w", err)
	}
	if d.Name == "" || d.Version == "" || len(d.Name) > 256 || len(d.Version) > 256 {
		return Domain{}, errors.New("the domain needs a name and a version of at most 256 bytes")
	}
	return Domain{Name: d.Name, Version: d.Version, ChainID: cid, VerifyingContract: vc}, nil
}

// Read parses the wire form back.
func (j AuthorizationJSON) Read() (Authorization, error) {
	var a Authorization
	var err error
	if a.From, err = ParseAddress(j.From); err != nil {
		return a, fmt.Errorf("from: %w", err)
	}
	if a.To, err = ParseAddress(j.To); err != nil {
		return a, fmt.Errorf("to: %w", err)
	}
	if a.Value, err = uintField("value", j.Value); err != nil {
		return a, err
	}
	if a.ValidAfter, err = uintField("validAfter", j.ValidAfter); err != nil {
		return a, err
	}
	if a.ValidBefore, err = uintField("validBefore", j.ValidBefore); err != nil {
		return a, err
	}
	if len(j.Nonce) != 66 || j.Nonce[:2] != "0x" {
		return a, errors.New("nonce must be 0x and 64 hex digits")
	}
	b, err := hex.DecodeString(j.Nonce[2:])
	if err != nil {
		return a, errors.New("nonce must be 0x and 64 hex digits")
	}
	copy(a.Nonce[:], b)
	return a, nil
}

// ServePayer answers payer-signing requests on ln until ctx is done, then
// closes ln, waits for the connections in progress and returns nil. It
// signs only what lim allows, and logs every signature and refusal.
func ServePayer(ctx context.Context, ln net.Listener, s *KeySigner, lim PayerLimits, log *slog.Logger) error {
	log.Info("payer signer ready", "payer", s.Address().Hex(), "addr", ln.Addr().String(),
		"max_value", lim.MaxValue, "max_authorization_seconds", lim.MaxSeconds)
	return lineproto.Serve(ctx, ln, "payer signer", log, func(ctx context.Context, conn net.Conn) {
		servePayerConn(ctx, conn, s, lim, log)
	})
}

func servePayerConn(ctx context.Context, conn net.Conn, s *KeySigner, lim PayerLimits, log *slog.Logger) {
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	br := bufio.NewReaderSize(conn, maxPayerLine)
	enc := json.NewEncoder(conn)
	for {
		conn.SetDeadline(time.Now().Add(payerIOTimeout))
		line, err := br.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				enc.Encode(payerResponse{Error: fmt.Sprintf("request longer than %d bytes", maxPayerLine)})
			}
			return
		}
		if err := enc.Encode(answerPayer(ctx, line, s, lim, log)); err != nil {
			return
		}
	}
}

func answerPayer(ctx context.Context, line []byte, s *KeySigner, lim PayerLimits, log *slog.Logger) payerResponse {
	var req payerRequest
	// Read exactly: a member named twice or spelled in another case would
	// be read one way here and another way by whoever wrote the request.
	if err := strictjson.Check(line, &req); err != nil {
		var se *strictjson.Error
		if errors.As(err, &se) {
			return payerResponse{Error: "request is not exact: " + clip(se.Error())}
		}
		return payerResponse{Error: "request is not a JSON object"}
	}
	if err := json.Unmarshal(line, &req); err != nil {
		return payerResponse{Error: "request is not a JSON object"}
	}
	switch req.Op {
	case "payer":
		return payerResponse{Address: s.Address().Hex()}
	case "sign_authorization":
		if req.Domain == nil || req.Authorization == nil {
			return payerResponse{Error: "sign_authorization needs a domain and an authorization"}
		}
		d, err := req.Domain.read()
		if err != nil {
			return payerResponse{Error: "domain: " + err.Error()}
		}
		a, err := req.Authorization.Read()
		if err != nil {
			return payerResponse{Error: "authorization: " + err.Error()}
		}
		asset, err := lim.check(d, a)
		if err != nil {
			log.Warn("payer signer refused a request", "reason", err.Error(), "to", a.To.Hex(), "value_atomic", clip(a.Value.String()))
			return payerResponse{Error: err.Error()}
		}
		sig, err := s.SignAuthorization(ctx, d, a)
		if err != nil {
			log.Warn("payer signer refused a request", "reason", err.Error())
			return payerResponse{Error: err.Error()}
		}
		log.Info("payer signer signed", "payee", a.To.Hex(), "value", display(a.Value, asset), "value_atomic", a.Value.String(),
			"asset", asset.Key, "valid_before", a.ValidBefore.String(), "nonce", "0x"+hex.EncodeToString(a.Nonce[:]))
		return payerResponse{Signature: "0x" + hex.EncodeToString(sig[:])}
	}
	return payerResponse{Error: fmt.Sprintf("unknown op %q", clip(req.Op))}
}

// RemoteSigner is the client side of a payer signer process.
type RemoteSigner struct {
	path    string
	timeout time.Duration
	addr    Address
}

// DialPayer connects to the payer signer at path (a unix socket) and asks
// its address. Every later request opens its own connection and gives up
// after timeout: a stopped or hung signer is an error, never a hang.
func DialPayer(ctx context.Context, path string, timeout time.Duration) (*RemoteSigner, error) {
	if timeout <= 0 {
		return nil, errors.New("payer signer: timeout must be positive")
	}
	s := &RemoteSigner{path: path, timeout: timeout}
	addr, err := s.payer(ctx)
	if err != nil {
		return nil, err
	}
	s.addr = addr
	return s, nil
}

func (s *RemoteSigner) payer(ctx context.Context) (Address, error) {
	resp, err := s.call(ctx, payerRequest{Op: "payer"})
	if err != nil {
		return Address{}, err
	}
	a, err := ParseAddress(resp.Address)
	if err != nil {
		return Address{}, fmt.Errorf("payer signer %s: its address: %w", s.path, err)
	}
	return a, nil
}

// Address is the payer address the signer announced at connection.
func (s *RemoteSigner) Address() Address { return s.addr }

// Ping checks the signer still answers with the same payer address.
func (s *RemoteSigner) Ping(ctx context.Context) error {
	a, err := s.payer(ctx)
	if err != nil {
		return err
	}
	if a != s.addr {
		return fmt.Errorf("payer signer %s now pays from %s, not %s", s.path, a.Hex(), s.addr.Hex())
	}
	return nil
}

// SignAuthorization asks the signer process to sign; the caller (Sign)
// checks the signature recovers to the payer.
func (s *RemoteSigner) SignAuthorization(ctx context.Context, d Domain, a Authorization) ([65]byte, error) {
	var sig [65]byte
	dj := domainJSON{Name: d.Name, Version: d.Version, ChainID: d.ChainID.String(), VerifyingContract: d.VerifyingContract.Hex()}
	aj := a.JSON()
	resp, err := s.call(ctx, payerRequest{Op: "sign_authorization", Domain: &dj, Authorization: &aj})
	if err != nil {
		return sig, err
	}
	if len(resp.Signature) != 132 || resp.Signature[:2] != "0x" {
		return sig, fmt.Errorf("payer signer %s: answered with a malformed signature", s.path)
	}
	b, err := hex.DecodeString(resp.Signature[2:])
	if err != nil {
		return sig, fmt.Errorf("payer signer %s: answered with a malformed signature", s.path)
	}
	copy(sig[:], b)
	return sig, nil
}

func (s *RemoteSigner) call(ctx context.Context, req payerRequest) (payerResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var resp payerResponse
	label := "payer signer " + s.path
	if err := lineproto.Call(ctx, label, s.path, maxPayerLine, req, &resp); err != nil {
		return payerResponse{}, err
	}
	if resp.Error != "" {
		return payerResponse{}, fmt.Errorf("%s: %s", label, resp.Error)
	}
	return resp, nil
}
