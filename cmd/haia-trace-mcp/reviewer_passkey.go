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
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

const reviewerPasskeyDetails = `add prints a one-time link (valid 10 minutes) for the reviewer to open in
the console and register a passkey, and waits. It then shows the passkey's
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
	if err := checkEnrolLink(ctx, collectURL, token); err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer passkey add: %v; no link was issued, nothing was written\n", err)
		return exitCode(exitFail)
	}
	fmt.Fprintf(stdout, "Open this one-time link (valid %s) where %s registers a passkey:\n", console.EnrolTTL, termsafe.String(*id))
	fmt.Fprintf(stdout, "%senrol?t=%s\n", origin+u.Path, url.QueryEscape(token))
	fmt.Fprintf(stdout, "waiting for the registration…\n")
	cred, err := collectEnrolment(ctx, collectURL, token, *wait)
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
		if !stdinIsTerminal(stdin) {
			fmt.Fprintf(stderr, "haia-trace-mcp reviewer passkey add: no terminal to confirm on; compare the fingerprint and pass --yes; nothing was written\n")
			return exitCode(exitFail)
		}
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

// collectEnrolment polls the console until the reviewer has registered,
// then takes the credential (once).
func collectEnrolment(ctx context.Context, endpoint, token string, wait time.Duration) (passkey.Credential, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	client := &http.Client{Timeout: 10 * time.Second}
	body, _ := json.Marshal(map[string]string{"token": token})
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
		if err != nil {
			return passkey.Credential{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err == nil {
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
			case http.StatusAccepted, http.StatusTooManyRequests:
			default:
				var e struct {
					Error string `json:"error"`
				}
				_ = json.Unmarshal(data, &e)
				return passkey.Credential{}, fmt.Errorf("the console refused: %s (HTTP %d)", termsafe.String(e.Error), resp.StatusCode)
			}
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return passkey.Credential{}, fmt.Errorf("no registration within %s", wait)
			}
			return passkey.Credential{}, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// checkEnrolLink asks the console once whether it takes token: it answers
// that it waits for the reviewer (202), or why not.
func checkEnrolLink(ctx context.Context, endpoint, token string) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	body, _ := json.Marshal(map[string]string{"token": token})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("the console at %s cannot be reached: %w", endpoint, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode == http.StatusAccepted {
		return nil
	}
	var e struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(data, &e)
	if resp.StatusCode == http.StatusForbidden {
		return fmt.Errorf("the console refuses a link signed with this key (%s): give the server's own --key-file, or its --params-key-file when it signs through --signer", termsafe.String(e.Error))
	}
	return fmt.Errorf("the console refused the link: %s (HTTP %d)", termsafe.String(e.Error), resp.StatusCode)
}

func stdinIsTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && isTerminal(f)
}
