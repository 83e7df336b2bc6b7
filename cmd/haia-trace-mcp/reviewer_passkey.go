package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

const reviewerPasskeyDetails = `add checks first what could stop it later (a terminal to confirm on, or
--yes; a reviewers file it can read and write; the console's own URL), then
prints a one-time link (valid 10 minutes) for the reviewer to open in the
console and register a passkey, and waits, asking the console to hold each
request up to 20 seconds (three a minute however long the reviewer takes;
a refusal or an unreachable console is asked again after a back-off from 2
to 30 seconds). It then shows the passkey's
fingerprint, which the reviewer's page shows too; once you confirm they
match (a prompt on a terminal, or --yes for scripts) it writes the public
key into the trusted reviewers file beside the reviewer's key. The server
never writes that file. remove takes the reviewer's passkeys (or one) out.
With a --tenants-dir server, enrol at a tenant's console
(--console-url …/console/t/TENANT/) and grant the tenants the reviewer may
decide for with --tenant (repeatable); without a grant the reviewer decides
for no tenant there.
`

// defineReviewerPasskey is `reviewer passkey add|remove` (verb).
func defineReviewerPasskey(verb string) func(fs *flag.FlagSet) runFunc {
	return func(fs *flag.FlagSet) runFunc {
		id := fs.String("id", "", "the reviewer's id (required)")
		reviewers := reviewersFlag(fs)
		consoleURL, yes, wait, credential := new(string), new(bool), new(time.Duration), new(string)
		tenants := new(listFlag)
		keys := new(enrolKeyFlags)
		if verb == "add" {
			tenants = tenantGrantFlag(fs)
			keys.register(fs)
			fs.StringVar(consoleURL, "console-url", "http://localhost:8787/console/", "the console's address `URL` as the server's --console-url gives it")
			fs.BoolVar(yes, "yes", false, "write the passkey without asking (for scripts; compare the fingerprint yourself)")
			fs.DurationVar(wait, "wait", console.EnrolTTL, "how long to wait for the reviewer to register (at most 10m)")
		} else {
			fs.StringVar(credential, "credential", "", "the credential `ID` to remove (default: every passkey of --id)")
		}
		return func(ctx context.Context, env *cmdEnv, _ []string) error {
			return runReviewerPasskey(ctx, env.stdin, env.stdout, env.stderr, verb, id, reviewers, consoleURL, credential, yes, wait, *tenants, keys)
		}
	}
}

// enrolKeyFlags name the server's key, from which the command derives the
// key that signs enrolment links (the console refuses any other link).
type enrolKeyFlags struct {
	keyFile, paramsKeyFile string
}

func (k *enrolKeyFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.keyFile, "key-file", "", "the server's signing key `FILE` (its --key-file), read to sign the enrolment link; never created (default: the server's default, $HAIA_CONFIG_DIR/signing-key.pem or $XDG_CONFIG_HOME/haia-trace-mcp/signing-key.pem)")
	fs.StringVar(&k.paramsKeyFile, "params-key-file", "", "the server's paramsHash key `FILE` (its --params-key-file), read instead of --key-file when the server signs through --signer")
}

func runReviewerPasskey(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer, verb string, id, reviewers, consoleURL, credential *string, yes *bool, wait *time.Duration, tenants []string, keys *enrolKeyFlags) error {
	if err := reviewlog.CheckReviewerID(*id); err != nil {
		return usageErrorf("--id: %v", err)
	}
	if err := checkTenantGrants(tenants); err != nil {
		return err
	}
	path, err := reviewersFile(*reviewers)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer passkey: %v\n", err)
		return exitCode(exitFail)
	}
	if verb == "remove" {
		n, err := reviewlog.RemovePasskeys(path, *id, *credential)
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp reviewer passkey remove: %v\n", err)
			return exitCode(exitFail)
		}
		if n == 0 {
			fmt.Fprintf(stderr, "haia-trace-mcp reviewer passkey remove: %s lists no such passkey for %s; nothing changed\n", path, termsafe.String(*id))
			return exitCode(exitFail)
		}
		fmt.Fprintf(stdout, "removed %d passkey(s) of %s from %s\n", n, termsafe.String(*id), path)
		return nil
	}
	if *wait <= 0 || *wait > console.EnrolTTL {
		return usageErrorf("--wait must be above zero and at most %s (the link's life)", console.EnrolTTL)
	}
	u, err := url.Parse(*consoleURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !console.IsConsolePath(u.Path) {
		return usageErrorf("--console-url %q: want the console's absolute URL ending in /console/ (or a tenant's, /console/t/TENANT/)", *consoleURL)
	}
	// Everything that can fail is checked before the link is issued: once
	// the reviewer registers, the link is spent.
	if !*yes && !stdinIsTerminal(stdin) {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer passkey add: no terminal to confirm the fingerprint on: run it on a terminal, or pass --yes and compare the fingerprint yourself; no link was issued, nothing was written\n")
		return exitCode(exitFail)
	}
	if err := reviewlog.CheckAddPasskey(path, *id, tenants...); err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer passkey add: the trusted reviewers file: %s; no link was issued, nothing was written\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	timing, scaled := enrolWaitTiming()
	if scaled != "" {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer passkey add: %s\n", scaled)
	}
	paramsKey, err := serverParamsKey(keys.keyFile, keys.paramsKeyFile)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer passkey add: the enrolment link is signed with a key derived from the server's: %v; nothing was written\n", err)
		return exitCode(exitFail)
	}
	token, err := console.NewEnrolToken(consoleEnrolKey(paramsKey), *id, time.Now())
	if err != nil {
		return usageErrorf("--id: %v", err)
	}
	origin := u.Scheme + "://" + u.Host
	collectURL := u.ResolveReference(&url.URL{Path: "api/enrol/collect"}).String()
	// Before the link is shown: the console must answer, and accept a link
	// signed with this key (else the reviewer would open a dead link).
	seen, err := checkEnrolLink(ctx, collectURL, token)
	if err == nil && seen.Origin != "" && (seen.Origin != origin || seen.RPID != u.Hostname()) {
		err = fmt.Errorf("the console at %s serves passkeys for %s (relying party %s), which a link under %s could not register: pass --console-url as the server's --console-url gives it", origin, termsafe.String(seen.Origin), termsafe.String(seen.RPID), origin)
	}
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer passkey add: %v; no link was issued, nothing was written\n", err)
		return exitCode(exitFail)
	}
	fmt.Fprintf(stdout, "Open this one-time link (valid %s) where %s registers a passkey:\n", console.EnrolTTL, termsafe.String(*id))
	fmt.Fprintf(stdout, "%senrol?t=%s\n", origin+u.Path, url.QueryEscape(token))
	fmt.Fprintf(stdout, "waiting for the registration…\n")
	cred, err := collectEnrolment(ctx, collectURL, token, timing.scaled(*wait), timing)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer passkey add: %v; nothing was written\n", err)
		return exitCode(exitFail)
	}
	if cred.RPID != u.Hostname() || cred.Origin != origin {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer passkey add: the console registered the passkey for %s (relying party %s), not %s; nothing was written\n", termsafe.String(cred.Origin), termsafe.String(cred.RPID), origin)
		return exitCode(exitFail)
	}
	if err := cred.Check(); err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer passkey add: %v; nothing was written\n", err)
		return exitCode(exitFail)
	}
	fp, _ := passkey.Fingerprint(cred.PublicKey)
	fmt.Fprintf(stdout, "registered: passkey %s for %s\n", cred.ID, termsafe.String(*id))
	fmt.Fprintf(stdout, "fingerprint: %s\n", fp)
	if !*yes {
		fmt.Fprintf(stdout, "Does the reviewer's page show the same fingerprint? Trust this passkey for %s? [y/N] ", termsafe.String(*id))
		line, _ := bufio.NewReader(stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			fmt.Fprintln(stdout, "not confirmed; nothing was written")
			return exitCode(exitFail)
		}
	}
	added, err := reviewlog.AddPasskey(path, *id, cred, tenants...)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer passkey add: %v\n", err)
		return exitCode(exitFail)
	}
	if added {
		fmt.Fprintf(stdout, "trusted in: %s (added; the server reads it at the next sign-in)\n", path)
	} else {
		fmt.Fprintf(stdout, "trusted in: %s (already listed)\n", path)
	}
	return nil
}

// enrolTiming is how reviewer passkey add waits for the registration: it
// asks the console to hold each collect request (hold) and, when the console
// answers at once, refuses, or cannot be reached, waits base, doubling up to
// max. A reviewer who takes minutes costs a request every hold.
type enrolTiming struct {
	hold, base, max time.Duration
	scale           int
}

// timeScaleEnv is a test hook: HAIA_TEST_TIME_SCALE=N makes reviewer
// passkey add wait N times faster (its --wait, holds and back-offs), so a
// test can play a reviewer who takes minutes in seconds against the real
// console. It is never needed in use.
const timeScaleEnv = "HAIA_TEST_TIME_SCALE"

// enrolWaitTiming is the timing in use, and a line saying so when the test
// hook changed it.
func enrolWaitTiming() (enrolTiming, string) {
	t := enrolTiming{hold: console.MaxCollectWait, base: 2 * time.Second, max: 30 * time.Second, scale: 1}
	v := os.Getenv(timeScaleEnv)
	if v == "" {
		return t, ""
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 100 {
		return t, fmt.Sprintf("%s=%q is not a whole number from 1 to 100; ignored", timeScaleEnv, v)
	}
	t.scale = n
	t.hold, t.base, t.max = t.scaled(t.hold), t.scaled(t.base), t.scaled(t.max)
	return t, fmt.Sprintf("%s=%d: waiting %d times faster (a test hook)", timeScaleEnv, n, n)
}

func (t enrolTiming) scaled(d time.Duration) time.Duration { return d / time.Duration(t.scale) }

// collectEnrolment waits for the reviewer's registration, then takes the
// credential (once). Each request asks the console to hold it up to hold
// (?wait=), so the command asks about three times a minute however long
// the reviewer takes; a console that answers at once (an older one), a 429
// (after its Retry-After) and an unreachable console are asked again after
// a back-off that doubles up to max, and a held request cut short (a write
// timeout shorter than the hold) halves the hold.
func collectEnrolment(ctx context.Context, endpoint, token string, wait time.Duration, tm enrolTiming) (passkey.Credential, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	body, _ := json.Marshal(map[string]string{"token": token})
	hold, backoff := tm.hold, tm.base
	for {
		secs := max(int(hold/time.Second), 1)
		u := endpoint + "?wait=" + strconv.Itoa(secs)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
		if err != nil {
			return passkey.Credential{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		asked := time.Now()
		resp, err := (&http.Client{Timeout: time.Duration(secs)*time.Second + 15*time.Second}).Do(req)
		pause := time.Duration(0)
		if err != nil {
			if ctx.Err() != nil {
				return passkey.Credential{}, collectGaveUp(ctx, wait)
			}
			pause, backoff = backoff, min(2*backoff, tm.max)
			if time.Since(asked) >= hold/2 && hold > time.Second {
				hold /= 2
			}
		} else {
			data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				var out struct {
					Credential passkey.Credential `json:"credential"`
				}
				if err := json.Unmarshal(data, &out); err != nil {
					return passkey.Credential{}, fmt.Errorf("the console answered a registration this command cannot read")
				}
				return out.Credential, nil
			case http.StatusAccepted:
				backoff = tm.base
				if time.Since(asked) < hold/2 {
					pause = tm.base // not held: ask no faster than every base
				}
			case http.StatusTooManyRequests:
				pause, backoff = backoff, min(2*backoff, tm.max)
				if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && ra > 0 {
					pause = max(pause, time.Duration(ra)*time.Second)
				}
			default:
				var e struct {
					Error string `json:"error"`
				}
				_ = json.Unmarshal(data, &e)
				return passkey.Credential{}, fmt.Errorf("the console refused: %s (HTTP %d)", termsafe.String(e.Error), resp.StatusCode)
			}
		}
		if pause == 0 {
			continue
		}
		select {
		case <-ctx.Done():
			return passkey.Credential{}, collectGaveUp(ctx, wait)
		case <-time.After(pause):
		}
	}
}

func collectGaveUp(ctx context.Context, wait time.Duration) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("no registration within %s", wait)
	}
	return ctx.Err()
}

// enrolConsole is what the console's waiting answer says of itself (an
// older console says nothing).
type enrolConsole struct {
	Origin string `json:"origin"`
	RPID   string `json:"rp_id"`
}

// checkEnrolLink asks the console once whether it takes token: it answers
// that it waits for the reviewer (202), with its origin and relying party,
// or why not.
func checkEnrolLink(ctx context.Context, endpoint, token string) (enrolConsole, error) {
	var c enrolConsole
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	body, _ := json.Marshal(map[string]string{"token": token})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return c, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return c, fmt.Errorf("the console at %s cannot be reached: %w", endpoint, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode == http.StatusAccepted {
		_ = json.Unmarshal(data, &c)
		return c, nil
	}
	var e struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(data, &e)
	if resp.StatusCode == http.StatusForbidden {
		return c, fmt.Errorf("the console refuses a link signed with this key (%s): give the server's own --key-file, or its --params-key-file when it signs through --signer", termsafe.String(e.Error))
	}
	return c, fmt.Errorf("the console refused the link: %s (HTTP %d)", termsafe.String(e.Error), resp.StatusCode)
}

// stdinIsTerminal reports whether r is a terminal someone can answer on:
// a character device is not enough (/dev/null is one, as a service or cron
// gives it), the terminal attributes must read.
func stdinIsTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), ttyGetAttr)
	return err == nil
}
