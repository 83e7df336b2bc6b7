package auth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
)

// Outcome labels one decision of the middleware, for metrics.
type Outcome string

const (
	OutcomeOK                Outcome = "ok"
	OutcomeNoToken           Outcome = "no_token"
	OutcomeInvalidToken      Outcome = "invalid_token"
	OutcomeInsufficientScope Outcome = "insufficient_scope"
	OutcomeBadRequest        Outcome = "bad_request"
)

type ctxKey struct{}

// WithIdentity returns a context carrying id, as the middleware does for
// every request it lets through.
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// IdentityFrom returns the verified identity of the request, if any.
func IdentityFrom(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(Identity)
	return id, ok
}

// SubjectFrom returns the verified `sub` of the request, for tool handlers.
func SubjectFrom(ctx context.Context) (string, bool) {
	id, ok := IdentityFrom(ctx)
	if !ok || id.Subject == "" {
		return "", false
	}
	return id.Subject, true
}

// Middleware admits only requests with a valid bearer token in the
// Authorization header, enforces the per-tool scopes of tools/call
// requests, and puts the Identity in the request context. Everything else
// is answered with an RFC 6750 challenge pointing at the RFC 9728 metadata.
//
// The scheme name is matched case-insensitively (RFC 9110 §11.1), so
// "bearer" works like "Bearer". Tokens in the query string or a form body
// are never read: such a request is simply unauthenticated.
func (v *Verifier) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, present, err := bearerToken(r.Header)
		if err != nil {
			v.outcome(OutcomeBadRequest)
			v.cfg.Logger.InfoContext(r.Context(), "auth: bad request", "reason", err.Error(), "remote", r.RemoteAddr)
			v.challenge(w, http.StatusBadRequest, "invalid_request", err.Error(), nil)
			return
		}
		if !present {
			v.outcome(OutcomeNoToken)
			v.challenge(w, http.StatusUnauthorized, "", "", nil)
			return
		}
		id, err := v.Verify(r.Context(), token)
		var te *TokenError
		var se *ScopeError
		switch {
		case errors.As(err, &te):
			v.outcome(OutcomeInvalidToken)
			v.cfg.Logger.InfoContext(r.Context(), "auth: token refused", "reason", te.Error(), "remote", r.RemoteAddr)
			v.challenge(w, http.StatusUnauthorized, "invalid_token", te.Description, nil)
			return
		case errors.As(err, &se):
			v.outcome(OutcomeInsufficientScope)
			v.cfg.Logger.InfoContext(r.Context(), "auth: scope missing", "sub", id.Subject, "missing", se.Missing)
			v.challenge(w, http.StatusForbidden, "insufficient_scope", "", se.Required)
			return
		case err != nil:
			// Verify returns only the two types above; anything else is a bug, kept closed.
			v.outcome(OutcomeInvalidToken)
			v.cfg.Logger.ErrorContext(r.Context(), "auth: unexpected verification error", "err", err)
			v.challenge(w, http.StatusUnauthorized, "invalid_token", descMalformed, nil)
			return
		}
		if v.needsPeek(id) && r.Body != nil && r.Body != http.NoBody {
			body, err := readBody(r, v.cfg.MaxBodyBytes)
			if err != nil {
				v.outcome(OutcomeBadRequest)
				http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			tools, perr := CalledTools(body)
			if perr != nil {
				v.outcome(OutcomeBadRequest)
				v.challenge(w, http.StatusBadRequest, "invalid_request", perr.Error(), nil)
				return
			}
			if need := v.toolScopesMissing(id, tools); len(need) > 0 {
				v.outcome(OutcomeInsufficientScope)
				v.cfg.Logger.InfoContext(r.Context(), "auth: tool scope missing", "sub", id.Subject, "tools", tools, "missing", need)
				v.challenge(w, http.StatusForbidden, "insufficient_scope", "", dedupe(append(append([]string{}, v.cfg.Scopes...), need...)))
				return
			}
		}
		v.outcome(OutcomeOK)
		next.ServeHTTP(w, r.WithContext(WithIdentity(r.Context(), id)))
	})
}

func (v *Verifier) outcome(o Outcome) {
	if v.cfg.OnOutcome != nil {
		v.cfg.OnOutcome(o)
	}
}

// needsPeek is true when some per-tool scope is not granted, so that bodies
// are read only when their content can change the answer.
func (v *Verifier) needsPeek(id Identity) bool {
	for _, s := range v.cfg.ToolScopes {
		if !id.HasScope(s) {
			return true
		}
	}
	return false
}

func (v *Verifier) toolScopesMissing(id Identity, tools []string) []string {
	var need []string
	for _, t := range tools {
		if s, ok := v.cfg.ToolScopes[t]; ok && !id.HasScope(s) {
			need = append(need, s)
		}
	}
	return dedupe(need)
}

var errBodyTooLarge = errors.New("request body too large")

func readBody(r *http.Request, limit int64) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	_ = r.Body.Close()
	if err != nil {
		return nil, errors.New("request body could not be read")
	}
	if int64(len(body)) > limit {
		return nil, errBodyTooLarge
	}
	return body, nil
}

// bearerToken extracts the token of an `Authorization: Bearer` header.
// present is false when there is no bearer credential at all (no header, or
// another scheme such as Basic); err is set for a request that is malformed.
func bearerToken(h http.Header) (token string, present bool, err error) {
	vals := h.Values("Authorization")
	switch len(vals) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", false, errors.New("more than one Authorization header")
	}
	scheme, rest, _ := strings.Cut(strings.TrimLeft(vals[0], " "), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", false, nil
	}
	return strings.Trim(rest, " \t"), true, nil
}

// challenge writes an RFC 6750 error response. errCode "" means no
// credentials were offered, so the challenge carries no error (§3.1).
func (v *Verifier) challenge(w http.ResponseWriter, status int, errCode, desc string, scopes []string) {
	w.Header().Set("WWW-Authenticate", v.challengeValue(errCode, desc, scopes))
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	body := map[string]string{}
	if errCode == "" {
		body["error"] = "unauthorized"
		body["error_description"] = "a bearer token is required"
	} else {
		body["error"] = errCode
		if desc != "" {
			body["error_description"] = desc
		}
		if len(scopes) > 0 {
			body["scope"] = strings.Join(scopes, " ")
		}
	}
	_ = json.NewEncoder(w).Encode(body)
}

// ChallengeValue is the WWW-Authenticate value the middleware sends; exposed
// so that tests and other handlers answer the same way.
func (v *Verifier) challengeValue(errCode, desc string, scopes []string) string {
	var b strings.Builder
	b.WriteString(`Bearer resource_metadata="`)
	b.WriteString(v.metadataURL)
	b.WriteByte('"')
	if errCode != "" {
		b.WriteString(`, error="`)
		b.WriteString(errCode)
		b.WriteByte('"')
	}
	if desc != "" {
		b.WriteString(`, error_description="`)
		b.WriteString(quoteSafe(desc))
		b.WriteByte('"')
	}
	if len(scopes) > 0 {
		b.WriteString(`, scope="`)
		b.WriteString(strings.Join(scopes, " "))
		b.WriteByte('"')
	}
	return b.String()
}

// quoteSafe keeps only the characters RFC 6750 §3 allows in error_description
// (%x20-21 / %x23-5B / %x5D-7E).
func quoteSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e || r == '"' || r == '\\' {
			return -1
		}
		return r
	}, s)
}

// rpcMessage is the part of a JSON-RPC message the scope check reads. It is
// decoded with encoding/json, the decoder mcp-go uses, so both read the same
// method and tool name (including encoding/json's case-insensitive keys).
type rpcMessage struct {
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

// CalledTools returns the tool names of the tools/call requests in a
// JSON-RPC body (a single message or a batch). A body that is not JSON-RPC
// yields no tools and no error: the MCP handler rejects it without running
// anything. A tools/call whose tool name cannot be read is an error, so that
// the check fails closed.
func CalledTools(body []byte) ([]string, error) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	var msgs []json.RawMessage
	if len(trimmed) > 0 && trimmed[0] == '[' {
		if err := json.Unmarshal(trimmed, &msgs); err != nil {
			return nil, nil
		}
	} else {
		msgs = []json.RawMessage{trimmed}
	}
	var tools []string
	for i, raw := range msgs {
		var m rpcMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			if len(msgs) == 1 {
				return nil, nil
			}
			continue // this batch element will be rejected on its own by the MCP handler
		}
		if m.Method != "tools/call" {
			continue
		}
		var p struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(m.Params, &p); err != nil || p.Name == "" {
			return nil, &bodyError{index: i}
		}
		tools = append(tools, p.Name)
	}
	return tools, nil
}

type bodyError struct{ index int }

func (e *bodyError) Error() string {
	return "tools/call request without a readable tool name in params.name"
}
