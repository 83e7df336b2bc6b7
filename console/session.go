package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"strings"
	"time"
)

// Sessions and sign-in challenges are stateless: each is MACed with the
// console's session key (Config.SessionKey), so every replica that holds
// the key accepts what another issued — a sign-in begun on one replica
// finishes on another, a session cookie reads the queue on any. That a
// challenge was used is recorded where every replica reads it when the
// store can (Config.SignIns: PostgreSQL), else in this process's memory
// (the file store: one host). What stays in one process's memory:
// sign-outs (the cookie is cleared in the browser; the server refuses it
// only on the replica that signed it out), and enrolments (the operator's
// command collects from the replica that served the link).

// minSessionKey is the shortest session key accepted.
const minSessionKey = 32

func (c *Console) mac(kind string, payload []byte) []byte {
	m := hmac.New(sha256.New, c.sessionKey)
	m.Write([]byte("haia-trace-mcp console " + kind + "\x00"))
	m.Write(payload)
	return m.Sum(nil)
}

// sessionClaims are what a session cookie carries.
type sessionClaims struct {
	Reviewer string `json:"r"`
	Expires  int64  `json:"e"`
	Nonce    string `json:"n"`
}

// newSession is the cookie value of a session of who until exp.
func (c *Console) newSession(who string, exp time.Time) string {
	n := make([]byte, 12)
	_, _ = rand.Read(n)
	payload, _ := json.Marshal(sessionClaims{Reviewer: who, Expires: exp.Unix(), Nonce: base64.RawURLEncoding.EncodeToString(n)})
	enc := base64.RawURLEncoding.EncodeToString
	return enc(payload) + "." + enc(c.mac("session", payload))
}

// openSession reads a session cookie: its MAC must hold under the key and
// it must not have expired or been signed out here.
func (c *Console) openSession(v string, now time.Time) (string, bool) {
	p, m, ok := strings.Cut(v, ".")
	if !ok || len(v) > 1024 {
		return "", false
	}
	payload, err1 := base64.RawURLEncoding.DecodeString(p)
	sum, err2 := base64.RawURLEncoding.DecodeString(m)
	if err1 != nil || err2 != nil || !hmac.Equal(sum, c.mac("session", payload)) {
		return "", false
	}
	var s sessionClaims
	if err := json.Unmarshal(payload, &s); err != nil || s.Reviewer == "" || !now.Before(time.Unix(s.Expires, 0)) {
		return "", false
	}
	c.mu.Lock()
	_, out := c.signedOut[m]
	c.mu.Unlock()
	if out {
		return "", false
	}
	return s.Reviewer, true
}

// signOut refuses the session cookie v here until it expires.
func (c *Console) signOut(v string, now time.Time) {
	_, m, ok := strings.Cut(v, ".")
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweep(now)
	if len(c.signedOut) >= maxPending {
		return // bounded; the browser's cookie is cleared anyway
	}
	c.signedOut[m] = now.Add(sessionTTL)
}

// A sign-in challenge is 32 bytes: a nonce (8), its expiry in Unix
// seconds (8), and the first 16 bytes of its MAC.
func (c *Console) newChallenge(now time.Time) []byte {
	ch := make([]byte, 32)
	_, _ = rand.Read(ch[:8])
	binary.BigEndian.PutUint64(ch[8:16], uint64(now.Add(ceremonyTTL).Unix()))
	copy(ch[16:], c.mac("login", ch[:16]))
	return ch
}

// checkChallenge says whether ch is a sign-in challenge this key issued,
// not expired, and returns its expiry. Whether it was used is
// useChallenge's.
func (c *Console) checkChallenge(ch []byte, now time.Time) (time.Time, bool) {
	if len(ch) != 32 || !hmac.Equal(ch[16:], c.mac("login", ch[:16])[:16]) {
		return time.Time{}, false
	}
	exp := time.Unix(int64(binary.BigEndian.Uint64(ch[8:16])), 0)
	if !now.Before(exp) || exp.After(now.Add(ceremonyTTL+time.Minute)) {
		return time.Time{}, false
	}
	return exp, true
}

// useChallenge marks sign-in challenge ch (expiring at exp) used and
// reports whether it was not used before: on every replica with
// Config.SignIns, else in this process.
func (c *Console) useChallenge(ctx context.Context, ch []byte, exp, now time.Time) (bool, error) {
	if c.cfg.SignIns != nil {
		id := sha256.Sum256(ch)
		return c.cfg.SignIns.UseSignIn(ctx, id[:], exp)
	}
	key := base64.RawURLEncoding.EncodeToString(ch)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweep(now)
	if _, used := c.logins[key]; used || len(c.logins) >= 16*maxPending {
		return false, nil
	}
	c.logins[key] = exp
	return true, nil
}
