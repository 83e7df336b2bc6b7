package notify

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader carries "sha256=" and the hex HMAC-SHA256 of the exact
// body, keyed with the shared secret.
const SignatureHeader = "X-Haia-Signature"

// maxResponseBytes is how much of a receiver's answer is read (and thrown
// away) so the connection can be reused.
const maxResponseBytes = 4096

// Webhook POSTs each message to an opt-in URL (--notify-url).
type Webhook struct {
	*queue
	url      string
	redacted string
	secret   []byte
	client   *http.Client
	timeout  time.Duration
	attempts int
	base     time.Duration
	max      time.Duration
}

// NewWebhook checks rawURL (http or https, with a host) and starts the
// sink. Each message is POSTed as {"event", "review", "text"} with
// Content-Type application/json and SignatureHeader. Network errors, 5xx
// and 429 answers are retried up to opts.Attempts times in all, with
// exponential backoff and jitter (a Retry-After is honoured up to
// opts.BackoffMax); other answers are final. Redirects are not followed.
// Each request is bounded by opts.Timeout. The URL's path and query are
// never logged: an incoming-webhook URL is itself a secret.
func NewWebhook(rawURL string, secret []byte, opts Options) (*Webhook, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url's error quotes the URL, which may hold a secret.
		return nil, errors.New("notify: the webhook URL is not a valid URL (not shown: it may hold a secret)")
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "http" && scheme != "https" {
		return nil, fmt.Errorf("notify: the webhook URL must start with http:// or https://, not %q", clip(u.Scheme+":"))
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, errors.New("notify: the webhook URL has no host")
	}
	if u.Fragment != "" {
		return nil, errors.New("notify: the webhook URL has a #fragment, which is never sent; remove it")
	}
	if len(secret) == 0 {
		return nil, errors.New("notify: the webhook secret is empty")
	}
	o := opts.withDefaults()
	w := &Webhook{
		url:      u.String(),
		redacted: scheme + "://" + u.Host,
		secret:   bytes.Clone(secret),
		timeout:  o.Timeout,
		attempts: o.Attempts,
		base:     o.BackoffBase,
		max:      o.BackoffMax,
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = o.Workers
	w.client = &http.Client{
		Transport: transport,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	if scheme == "http" && !isLoopback(u.Hostname()) {
		o.Logger.Warn("the notification webhook is plain http: reviews travel unencrypted (the signature only proves who sent them)", "url", w.redacted)
	}
	w.queue = newQueue(SinkWebhook, o, w.send)
	return w, nil
}

// URL is the webhook's scheme and host, safe to print.
func (w *Webhook) URL() string { return w.redacted }

// Sign returns the value of SignatureHeader for body.
func Sign(secret, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// send delivers one message, retrying what may pass on a later try.
func (w *Webhook) send(ctx context.Context, j job) error {
	sig := Sign(w.secret, j.body)
	for attempt := 1; ; attempt++ {
		retry, after, err := w.post(ctx, j, sig)
		if err == nil {
			return nil
		}
		if !retry || attempt >= w.attempts || ctx.Err() != nil {
			return fmt.Errorf("POST %s: %w (attempt %d of at most %d)", w.redacted, err, attempt, w.attempts)
		}
		wait := w.backoff(attempt)
		if after > wait {
			wait = min(after, w.max)
		}
		w.logger.Debug("notification will be retried", "event", j.msg.Event, "review_id", j.msg.ReviewID, "attempt", attempt, "wait", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("POST %s: %w; shut down before attempt %d", w.redacted, err, attempt+1)
		case <-t.C:
		}
		w.counts.retried.Add(1)
	}
}

// backoff is the pause after the attempt-th failure: base·2^(attempt−1),
// capped, of which a random half is taken off (jitter).
func (w *Webhook) backoff(attempt int) time.Duration {
	d := w.max
	if attempt < 31 {
		d = min(w.base<<(attempt-1), w.max)
	}
	if d <= 0 {
		d = w.max
	}
	half := d / 2
	return half + rand.N(half+1)
}

// post makes one attempt: whether a failure may be retried, and the pause
// the receiver asked for.
func (w *Webhook) post(ctx context.Context, j job, sig string) (bool, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(j.body))
	if err != nil {
		return false, 0, fmt.Errorf("make the request: %w", redact(err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "haia-trace-mcp-notify")
	req.Header.Set(SignatureHeader, sig)
	req.Header.Set("X-Haia-Event", j.msg.Event)
	resp, err := w.client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return true, 0, fmt.Errorf("no answer within %s", w.timeout)
		}
		return true, 0, redact(err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBytes))
	resp.Body.Close()
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return false, 0, nil
	case c == http.StatusTooManyRequests || c >= 500:
		return true, retryAfter(resp.Header.Get("Retry-After"), time.Now()), fmt.Errorf("the receiver answered %s", resp.Status)
	case c >= 300 && c < 400:
		return false, 0, fmt.Errorf("the receiver answered %s; redirects are not followed (point --notify-url at the final address)", resp.Status)
	default:
		return false, 0, fmt.Errorf("the receiver answered %s, which is not retried", resp.Status)
	}
}

// redact drops the URL from a *url.Error: its path may be a secret.
func redact(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// retryAfter reads a Retry-After header: seconds or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
		return time.Duration(min(n, 86400)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
