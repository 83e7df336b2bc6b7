package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/dossier"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const dossierDetails = `export writes one self-contained JSON file for one x402 payment the guard
signed: the decision receipt, the human decision (its receipts: a
reviewer's key or a passkey assertion), the authorization with its EIP-712
digest and the payer's signature, the seller's signed offer, the settlement
with the seller's signed receipt, and the segments of the decision chains
that hold every receipt, each receipt linked to the one before it, and
for each segment the checkpoints that prove it part of its chain: the
chain's head signed now with the server's key (--key-file or --signer;
the key must be in the store's keyring) with the receipts that link the
segment to it, and with --checkpoints DIR the newest checkpoint kept
there at or after the segment's end; and the public key the policy pinned
(sellerKeys) for a JWS offer or receipt under a did:web key identifier,
when it is the key that verified it. The key is a nonce, a receipt id,
or RUN_ID/OPERATION_ID of the Trace operation that used it.
verify checks every signature and link of such a file offline and prints
each link's verdict; a JWS is verified against the key the file carries
for its kid (pinned by the operator, never fetched). The keys it trusts are --keyring's (without it, the
keyring the file carries: UNVERIFIED); --reviewers holds the human
decisions to a trusted reviewers file, as verify does.
exit codes (as verify): 0 VALID, 1 UNVERIFIED, 2 TAMPERED, 3 MALFORMED,
4 usage or unreadable file, 5 UNTRUSTED
`

func defineDossierExport(fs *flag.FlagSet) runFunc {
	var f stackFlags
	f.register(fs, true)
	out := fs.String("out", "", "write the dossier to `FILE` (default: stdout)")
	keyFile := fs.String("key-file", "", "the server's signing key, which signs each chain's checkpoint at export; never created here\n(default: $HAIA_CONFIG_DIR/signing-key.pem, else $XDG_CONFIG_HOME/haia-trace-mcp/signing-key.pem)")
	signer := fs.String("signer", "", "sign through a signer process at unix:PATH instead of holding the key (see the signer command)")
	kept := fs.String("checkpoints", "", "a directory `DIR` of checkpoints kept by chain checkpoint: the newest at or after each segment's end is carried too")
	return func(ctx context.Context, env *cmdEnv, pos []string) error {
		return runDossierExport(ctx, env.stdout, env.stderr, pos[0], &f, *out, *keyFile, *signer, *kept)
	}
}

// dossierSigner opens the server's key for the export checkpoints: the
// key file as it is (a missing one is an error, never a new key) or the
// signer process.
func dossierSigner(keyFile, signer string) (noa.Signer, error) {
	if signer != "" {
		if keyFile != "" {
			return nil, errors.New("--signer and --key-file exclude each other: the key lives in the signer process")
		}
		path, ok := strings.CutPrefix(signer, "unix:")
		if !ok || path == "" {
			return nil, fmt.Errorf("--signer %q: want unix:PATH", signer)
		}
		rs, err := noa.DialSigner(path, app.SignerTimeout)
		if err != nil {
			return nil, fmt.Errorf("--signer: %w", err)
		}
		return rs, nil
	}
	if keyFile == "" {
		p, err := defaultConfigPath("signing-key.pem")
		if err != nil {
			return nil, fmt.Errorf("no --key-file given: %w", err)
		}
		keyFile = p
	}
	key, err := noa.LoadKeyFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("--key-file (the server's key signs each chain's checkpoint): %w", err)
	}
	return noa.NewKeySigner(key), nil
}

// maxKeptCheckpoints bounds the files --checkpoints reads.
const maxKeptCheckpoints = 100000

// readKeptCheckpoints reads every checkpoint file of dir (not its
// subdirectories). A file that is no checkpoint is named on stderr and
// left out.
func readKeptCheckpoints(dir string, stderr io.Writer) ([]dossier.Kept, error) {
	if dir == "" {
		return nil, nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("--checkpoints: %w", err)
	}
	if len(ents) > maxKeptCheckpoints {
		return nil, fmt.Errorf("--checkpoints %s holds %d files, more than %d", dir, len(ents), maxKeptCheckpoints)
	}
	var out []dossier.Kept
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		b, err := readBounded(p, maxTrustFileBytes)
		if err == nil {
			var cp noa.Checkpoint
			if cp, err = noa.ParseCheckpoint(b); err == nil {
				out = append(out, dossier.Kept{Name: p, Raw: b, CP: cp})
				continue
			}
		}
		fmt.Fprintf(stderr, "note: --checkpoints: %s left out: %s\n", termsafe.String(p), termsafe.String(err.Error()))
	}
	return out, nil
}

func runDossierExport(ctx context.Context, stdout, stderr io.Writer, want string, f *stackFlags, out, keyFile, signerAddr, keptDir string) error {
	fail := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "haia-trace-mcp dossier export: %s\n", termsafe.String(fmt.Sprintf(format, a...)))
		return exitCode(exitFail)
	}
	signer, err := dossierSigner(keyFile, signerAddr)
	if err != nil {
		return usageErrorf("%v", err)
	}
	kept, err := readKeptCheckpoints(keptDir, stderr)
	if err != nil {
		return usageErrorf("%v", err)
	}
	st, err := f.open(ctx, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	log := st.Log()
	found, err := dossier.Find(ctx, log, want)
	if errors.Is(err, dossier.ErrNotFound) && strings.Count(want, "/") == 1 {
		all, err2 := log.Authorizations(ctx)
		if err2 != nil {
			return fail("%v", err2)
		}
		for i := range all {
			uses, err2 := traceUses(st.Root().Dir(), all[i])
			if err2 != nil {
				return fail("the Trace could not be searched: %v", err2)
			}
			for _, u := range uses {
				if u.RunID+"/"+u.OperationID == want {
					found, err = all[i], nil
				}
			}
		}
	}
	if errors.Is(err, dossier.ErrNotFound) {
		fmt.Fprintf(stderr, "haia-trace-mcp dossier export: no authorization with nonce, receipt or Trace operation %q in %s\n", termsafe.String(want), termsafe.String(log.Path()))
		return exitCode(authExitUnknown)
	}
	if err != nil {
		return fail("%v", err)
	}
	d, err := dossier.Build(ctx, log, found, dossier.Options{Signer: signer, Kept: kept,
		PinnedKeys: st.Policy().SellerKeysPinned,
		Warn: func(msg string) {
			fmt.Fprintf(stderr, "haia-trace-mcp dossier export: warning: %s\n", termsafe.String(msg))
		}})
	if err != nil {
		return fail("%v", err)
	}
	b, err := dossier.Marshal(d)
	if err != nil {
		return fail("%v", err)
	}
	if out == "" {
		_, err = stdout.Write(b)
		return err
	}
	if err := os.WriteFile(out, b, 0o600); err != nil {
		return fail("%v", err)
	}
	cps := 0
	for _, s := range d.Segments {
		cps += len(s.Checkpoints)
	}
	fmt.Fprintf(stdout, "dossier of authorization %s written to %s (%s in %s, %s)\n", d.Nonce, termsafe.String(out),
		countOf(d.Receipts(), "receipt"), countOf(len(d.Segments), "segment"), countOf(cps, "checkpoint"))
	return nil
}

// countOf writes "1 receipt", "2 receipts".
func countOf(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func defineDossierVerify(fs *flag.FlagSet) runFunc {
	keyringFile := keyringFlag(fs)
	reviewers := fs.String("reviewers", "", "hold the human decision to this trusted reviewers `FILE` (default: none, the keys alone)")
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, env *cmdEnv, pos []string) error {
		return runDossierVerify(env.stdout, env.stderr, pos[0], *keyringFile, *reviewers, *asJSON)
	}
}

func runDossierVerify(stdout, stderr io.Writer, path, keyringFile, reviewersFile string, asJSON bool) error {
	usage := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "haia-trace-mcp dossier verify: %s\n", termsafe.String(fmt.Sprintf(format, a...)))
		return exitCode(exitVerifyUsage)
	}
	data, err := readBounded(path, 64<<20)
	if err != nil {
		return usage("%v", err)
	}
	var keyring noa.Keyring
	if keyringFile != "" {
		kb, err := readBounded(keyringFile, maxTrustFileBytes)
		if err == nil {
			keyring, err = noa.ParseKeyring(kb)
		}
		if err != nil {
			return usage("--keyring: %v", err)
		}
	}
	var trust *reviewlog.ReviewerTrust
	if reviewersFile != "" {
		t, err := reviewlog.LoadReviewerTrust(reviewersFile, "")
		if err != nil {
			return usage("--reviewers: %v", err)
		}
		trust = &t
	}
	links := dossier.Verify(data, keyring, trust)
	worst := dossier.Worst(links)
	if asJSON {
		if code := reviewWriteJSON(stdout, stderr, map[string]any{"verdict": worst, "links": links}); code != exitOK {
			return exitCode(code)
		}
	} else {
		for _, l := range links {
			fmt.Fprintf(stdout, "%-10s %-26s %s\n", l.Verdict, l.Link, termsafe.String(l.Reason))
		}
		fmt.Fprintf(stdout, "%s: %d links checked\n", worst, len(links))
		if keyringFile == "" {
			fmt.Fprintln(stderr, "note: no --keyring: the receipts were checked under the keyring the file itself carries")
		}
	}
	if code := dossier.ExitCode(worst); code != 0 {
		return exitCode(code)
	}
	return nil
}
