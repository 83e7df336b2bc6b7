package softauthn

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
)

// Browser drives the reviewer console as its page script does: a cookie
// jar, the console's Origin and CSRF token on every POST, and an
// Authenticator answering the ceremonies.
type Browser struct {
	Client *http.Client
	Base   string // the console URL, ending in /console/
	Origin string
	RPID   string
	Auth   *Authenticator
	csrf   string
}

// NewBrowser opens the console's first page (which sets the CSRF cookie).
func NewBrowser(base string, a *Authenticator) (*Browser, error) {
	return newBrowser(base, a, &http.Client{})
}

// NewBrowserThrough is NewBrowser connecting to addr (host:port) whatever
// base names: one replica of several behind base's address, as a load
// balancer would pick it.
func NewBrowserThrough(base, addr string, a *Authenticator) (*Browser, error) {
	tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	return newBrowser(base, a, &http.Client{Transport: tr})
}

func newBrowser(base string, a *Authenticator, client *http.Client) (*Browser, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	jar, _ := cookiejar.New(nil)
	client.Jar = jar
	b := &Browser{Client: client, Base: base, Origin: u.Scheme + "://" + u.Host, RPID: u.Hostname(), Auth: a}
	if _, _, err := b.Get(""); err != nil {
		return nil, err
	}
	for _, ck := range jar.Cookies(u) {
		if ck.Name == "haia_console_csrf" {
			b.csrf = ck.Value
		}
	}
	if b.csrf == "" {
		return nil, fmt.Errorf("the console at %s set no CSRF cookie", base)
	}
	return b, nil
}

// Get fetches a page under the console.
func (b *Browser) Get(path string) (int, string, error) {
	resp, err := b.Client.Get(b.Base + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// Post sends JSON to an API endpoint under the console.
func (b *Browser) Post(path string, v any) (int, map[string]any, error) {
	data, _ := json.Marshal(v)
	req, err := http.NewRequest(http.MethodPost, b.Base+path, bytes.NewReader(data))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", b.Origin)
	req.Header.Set("X-CSRF-Token", b.csrf)
	resp, err := b.Client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out, nil
}

func challengeOf(opts map[string]any) ([]byte, error) {
	pk, _ := opts["publicKey"].(map[string]any)
	s, _ := pk["challenge"].(string)
	c, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(c) == 0 {
		return nil, fmt.Errorf("no challenge in %v", opts)
	}
	return c, nil
}

// call posts begin, answers with fn over the challenge, and posts finish.
func (b *Browser) call(begin, finish string, beginBody map[string]any, fn func([]byte) ([]byte, error), finishBody map[string]any) (map[string]any, error) {
	code, opts, err := b.Post(begin, beginBody)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("%s: HTTP %d %v", begin, code, opts)
	}
	ch, err := challengeOf(opts)
	if err != nil {
		return nil, err
	}
	cred, err := fn(ch)
	if err != nil {
		return nil, err
	}
	finishBody["credential"] = json.RawMessage(cred)
	code, out, err := b.Post(finish, finishBody)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return out, fmt.Errorf("%s: HTTP %d %v", finish, code, out)
	}
	return out, nil
}

// Enrol registers the authenticator's credential with a one-time token
// and returns the fingerprint the console shows.
func (b *Browser) Enrol(token string) (string, error) {
	out, err := b.call("api/enrol/begin", "api/enrol/finish", map[string]any{"token": token},
		func(ch []byte) ([]byte, error) { return b.Auth.Attestation(b.RPID, b.Origin, ch) }, map[string]any{"token": token})
	if err != nil {
		return "", err
	}
	fp, _ := out["fingerprint"].(string)
	return fp, nil
}

func (b *Browser) assert(ch []byte) ([]byte, error) {
	x, err := b.Auth.Assert(b.RPID, b.Origin, ch)
	if err != nil {
		return nil, err
	}
	return x.JSON()
}

// SignIn signs in with the authenticator's passkey.
func (b *Browser) SignIn() error {
	_, err := b.call("api/login/begin", "api/login/finish", map[string]any{}, b.assert, map[string]any{})
	return err
}

// Decide approves or rejects review id with note, one assertion.
func (b *Browser) Decide(id, decision, note string) (map[string]any, error) {
	return b.call("api/reviews/"+id+"/begin", "api/reviews/"+id+"/finish", map[string]any{"decision": decision, "note": note}, b.assert,
		map[string]any{"decision": decision, "note": note})
}
