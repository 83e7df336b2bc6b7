package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

const verifyDetails = `Verifies the NOA JSON-array form or this product's chain file (one receipt
per line, verified as it is read, in bounded memory). KEYRING may be given
as a second argument, as the NOA reference verifier accepts it.
--follow: CHAIN is one segment file of a segmented chain (<chain>.ndjson,
<chain>.<k>.ndjson); verify every segment from 0 and the signed link
between each two, end to end; --checkpoint is then held against the last
segment.
--store postgres://…: CHAIN is a chain id in that store; every segment and
link is verified as --follow does, against the store's keyring unless
--keyring names another.
--reviewers FILE: also hold every human decision in the chain to this
trusted reviewers file, as the server does: signed by the key (or a passkey)
the file lists for its reviewer; with --tenant NAME, also granted NAME by
the file (as a server with --tenants-dir reads it), in a chain of NAME's.
Without --reviewers the check is the keys' alone.
Prints one line (verdict: reason) on stdout, warnings on stderr.
exit 0 VALID, 1 UNVERIFIED (no keyring), 2 TAMPERED, 3 MALFORMED,
4 usage or unreadable file, 5 UNTRUSTED (identity manifest, or a human
decision the reviewers file does not trust or grant)
`

// exitVerifyUsage is the NOA verifier's usage exit code; 2 means TAMPERED.
const exitVerifyUsage = 4

// maxTrustFileBytes bounds a keyring, checkpoint or identity file.
const maxTrustFileBytes = 4 << 20

// defineVerify is `haia-trace-mcp verify`, the NOA verifier.
func defineVerify(fs *flag.FlagSet) runFunc {
	keyring := fs.String("keyring", "", "keyring file `K` ({kid: base64 SPKI})")
	checkpoint := fs.String("checkpoint", "", "signed checkpoint file `C` (noa.checkpoint/0.1)")
	identity := fs.String("identity", "", "identity manifest `M` ({agent.id: [kid]})")
	follow := fs.Bool("follow", false, "verify every segment of CHAIN's chain and the links between them")
	storeFlag := fs.String("store", "", "verify chain id CHAIN, every segment, in this PostgreSQL store (`URL`; default $"+storeEnv+" when it is a postgres:// URL)")
	reviewers := fs.String("reviewers", "", "also hold every human decision to this trusted reviewers `FILE` (default: none, the keys alone)")
	tenant := fs.String("tenant", "", "with --reviewers: the tenant `NAME` whose grants apply, as a server with --tenants-dir reads them")
	return func(ctx context.Context, env *cmdEnv, pos []string) error {
		var rc *reviewerCheck
		switch {
		case *tenant != "" && *reviewers == "":
			return usageErrorf("--tenant names whose grants apply; it needs --reviewers FILE")
		case *tenant != "" && !receipt.IsSlug(*tenant):
			return usageErrorf("--tenant %q is not a tenant name (a bare slug)", *tenant)
		case *reviewers != "":
			trust, err := reviewlog.LoadReviewerTrust(*reviewers, *tenant)
			if err != nil {
				fmt.Fprintf(env.stderr, "verify: --reviewers: %s\n", termsafe.String(err.Error()))
				return exitCode(exitVerifyUsage)
			}
			rc = &reviewerCheck{trust: trust}
		}
		return runVerify(ctx, env.stdout, env.stderr, pos, keyring, checkpoint, identity, storeFlag, follow, rc)
	}
}

func runVerify(ctx context.Context, stdout, stderr io.Writer, pos []string, keyring, checkpoint, identity, storeFlag *string, follow *bool, rc *reviewerCheck) error {
	if len(pos) == 2 {
		if *keyring != "" {
			return usageErrorf("the keyring is given twice (argument and --keyring)")
		}
		*keyring = pos[1]
	}

	var docs noa.Documents
	for _, in := range []struct {
		path string
		dst  *[]byte
	}{{*keyring, &docs.Keyring}, {*checkpoint, &docs.Checkpoint}, {*identity, &docs.Identity}} {
		if in.path == "" {
			continue
		}
		b, err := readBounded(in.path, maxTrustFileBytes)
		if err != nil {
			fmt.Fprintf(stderr, "verify: %v\n", err)
			return exitCode(exitVerifyUsage)
		}
		*in.dst = b
	}
	if rc != nil && docs.Keyring != nil {
		// The keyring that seals a passkey's decision is the server's.
		if kr, err := noa.ParseKeyring(docs.Keyring); err == nil {
			rc.trust.ServerKeys = kr
		}
	}
	var res noa.Result
	spec := *storeFlag
	if spec == "" && pgstore.IsURL(os.Getenv(storeEnv)) && !fileExists(pos[0]) {
		spec = os.Getenv(storeEnv)
	}
	if spec != "" && !app.IsFileStore(spec) {
		var code int
		if res, code = verifyInStore(ctx, spec, pos[0], docs, stderr, rc); code >= 0 {
			return exitCode(code)
		}
	} else if *follow {
		var code int
		if res, code = verifyFollow(pos[0], docs, stderr, rc); code >= 0 {
			return exitCode(code)
		}
	} else {
		f, err := os.Open(pos[0])
		if err != nil {
			fmt.Fprintf(stderr, "verify: %v\n", err)
			return exitCode(exitVerifyUsage)
		}
		defer f.Close()
		docs.Chain = f
		_ = newProgress(stderr, "verify").during(filepath.Base(pos[0]), func() error {
			res = noa.VerifyDocuments(docs)
			return nil
		})
		if n := otherSegments(pos[0]); n > 0 {
			fmt.Fprintf(stderr, "note: %s is one segment of a chain with %d more; --follow verifies them all end to end\n", filepath.Base(pos[0]), n)
		}
		path := pos[0]
		res = rc.apply(res, []noa.SegmentSource{{Name: filepath.Base(path), Open: func() (io.ReadCloser, error) { return os.Open(path) }}}, stderr)
	}
	for _, w := range res.Warnings {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	fmt.Fprintln(stdout, res.Line())
	return exitCode(res.Verdict.ExitCode())
}

// chainSegmentsAt lists the segment numbers of the chain the file at path
// belongs to, found beside it, ascending.
func chainSegmentsAt(path string) (string, []int, error) {
	base, _, ok := reviewlog.ParseSegmentFile(filepath.Base(path))
	if !ok {
		return "", nil, fmt.Errorf("%s: not a chain file name (<chain>.ndjson or <chain>.<k>.ndjson)", path)
	}
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return "", nil, err
	}
	var ks []int
	for _, e := range entries {
		if c, k, ok := reviewlog.ParseSegmentFile(e.Name()); ok && c == base && e.Type().IsRegular() {
			ks = append(ks, k)
		}
	}
	sort.Ints(ks)
	return base, ks, nil
}

// otherSegments is how many other segments sit beside the chain file at
// path (0 when it is not a segmented chain's file).
func otherSegments(path string) int {
	_, ks, err := chainSegmentsAt(path)
	if err != nil || len(ks) < 2 {
		return 0
	}
	return len(ks) - 1
}

// verifyFollow verifies every segment of the chain the file at path
// belongs to. A code ≥ 0 means stop with it (the reason is printed).
func verifyFollow(path string, docs noa.Documents, stderr io.Writer, rc *reviewerCheck) (noa.Result, int) {
	if _, err := os.Stat(path); err != nil {
		fmt.Fprintf(stderr, "verify: %v\n", err)
		return noa.Result{}, exitVerifyUsage
	}
	base, ks, err := chainSegmentsAt(path)
	if err != nil {
		fmt.Fprintf(stderr, "verify --follow: %v\n", err)
		return noa.Result{}, exitVerifyUsage
	}
	opt, bad := docs.Options()
	if bad != nil {
		return *bad, -1
	}
	dir := filepath.Dir(path)
	srcs := make([]noa.SegmentSource, 0, len(ks))
	for i, k := range ks {
		if k != i {
			// Evidence removed from the middle (or the start) of the chain.
			return noa.Result{Verdict: noa.Tampered, Chain: base, Reason: fmt.Sprintf("segment %d of chain %q (%s) is missing, segment %d is present", i, base, reviewlog.SegmentFile(base, i), k)}, -1
		}
		p := filepath.Join(dir, reviewlog.SegmentFile(base, k))
		srcs = append(srcs, noa.SegmentSource{Name: filepath.Base(p), Open: func() (io.ReadCloser, error) { return os.Open(p) }})
	}
	var res noa.Result
	err = newProgress(stderr, "verify").during(fmt.Sprintf("chain %s, %d segments", base, len(srcs)), func() (err error) {
		res, err = noa.VerifySegments(srcs, opt)
		return err
	})
	if err != nil {
		fmt.Fprintf(stderr, "verify --follow: %v\n", err)
		return noa.Result{}, exitVerifyUsage
	}
	return rc.apply(res, srcs, stderr), -1
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// verifyInStore verifies chain id (every segment and each link) as the
// store holds it, with the keyring given, else the store's own.
func verifyInStore(ctx context.Context, spec, id string, docs noa.Documents, stderr io.Writer, rc *reviewerCheck) (noa.Result, int) {
	if err := app.CheckStoreSpec(spec); err != nil {
		fmt.Fprintf(stderr, "verify: %v\n", err)
		return noa.Result{}, exitVerifyUsage
	}
	opt, bad := docs.Options()
	if bad != nil {
		return *bad, -1
	}
	st, err := app.OpenStore(ctx, nil, spec)
	if err != nil {
		fmt.Fprintf(stderr, "verify: %s\n", termsafe.String(err.Error()))
		return noa.Result{}, exitVerifyUsage
	}
	defer st.Close()
	var res noa.Result
	err = st.View(ctx, func(r reviewlog.Reader) (err error) {
		if opt.Keyring == nil {
			// The store's own keyring, as --keyring guard/keyring.json
			// is on the file store; one kept elsewhere is passed by flag.
			kr, err := r.Keyring(ctx)
			if err != nil {
				return fmt.Errorf("the store's keyring: %w", err)
			}
			if len(kr) > 0 {
				opt.Keyring = kr
				if rc != nil {
					rc.trust.ServerKeys = kr
				}
				fmt.Fprintf(stderr, "note: signatures checked against the store's keyring (%d keys); --keyring K checks them against a keyring kept elsewhere\n", len(kr))
			}
		}
		err = newProgress(stderr, "verify").during("chain "+id+" in "+st.Describe(), func() (err error) {
			res, err = reviewlog.VerifySegments(ctx, r, id, opt)
			return err
		})
		if err != nil || rc == nil {
			return err
		}
		segs, err := reviewlog.ChainSegments(ctx, r, id)
		if err != nil {
			return err
		}
		srcs := make([]noa.SegmentSource, len(segs))
		for i, s := range segs {
			srcs[i] = noa.SegmentSource{Name: s.File, Open: func() (io.ReadCloser, error) { return reviewlog.OpenSegment(ctx, r, s.File) }}
		}
		res = rc.apply(res, srcs, stderr)
		return nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "verify: chain %s in %s: %s\n", termsafe.String(id), st.Describe(), termsafe.String(err.Error()))
		return noa.Result{}, exitVerifyUsage
	}
	return res, -1
}

// reviewerCheck holds a chain's human decisions to a trusted reviewers
// file (verify --reviewers).
type reviewerCheck struct {
	trust reviewlog.ReviewerTrust
}

// maxReviewerFindings bounds the problems named on stderr.
const maxReviewerFindings = 20

// apply reads the receipts of a chain that verified (VALID, or UNVERIFIED
// for want of a keyring) once more and holds each HUMAN receipt to the
// file: a decision the file does not trust or grant makes the verdict
// UNTRUSTED, naming the first; each is listed on stderr. Any other
// verdict stands as it is.
func (c *reviewerCheck) apply(res noa.Result, srcs []noa.SegmentSource, stderr io.Writer) noa.Result {
	if c == nil {
		return res
	}
	if res.Verdict != noa.Valid && res.Verdict != noa.Unverified {
		fmt.Fprintln(stderr, "note: the human decisions were not held to the reviewers file: the chain itself does not verify")
		return res
	}
	var decisions int
	var problems []string
	for _, src := range srcs {
		err := eachReceipt(src, func(rc noa.Receipt) {
			if c.trust.Tenant != "" && rc.Scope.Tenant != nil && *rc.Scope.Tenant != c.trust.Tenant {
				problems = append(problems, fmt.Sprintf("receipt %s of %s is tenant %q's, not %q's", rc.ID, src.Name, *rc.Scope.Tenant, c.trust.Tenant))
				return
			}
			if rc.Agent.Principal != noa.PrincipalHuman {
				return
			}
			decisions++
			if why := c.trust.DecisionProblem(rc); why != "" {
				problems = append(problems, fmt.Sprintf("human receipt %s of %s does not count: %s", rc.ID, src.Name, why))
			}
		})
		if err != nil {
			// It verified a moment ago: a file changed under us.
			return noa.Result{Verdict: noa.Malformed, Chain: res.Chain, Reason: fmt.Sprintf("%s could not be read again to check its human decisions: %v", src.Name, err)}
		}
	}
	scope := "trusted reviewers file"
	if c.trust.Tenant != "" {
		scope += fmt.Sprintf(", grants of tenant %q", c.trust.Tenant)
	}
	for i, p := range problems {
		if i == maxReviewerFindings {
			fmt.Fprintf(stderr, "untrusted: %d more\n", len(problems)-i)
			break
		}
		fmt.Fprintf(stderr, "untrusted: %s\n", termsafe.String(p))
	}
	if len(problems) > 0 {
		more := ""
		if len(problems) > 1 {
			more = fmt.Sprintf(" (and %d more, on stderr)", len(problems)-1)
		}
		return noa.Result{Verdict: noa.Untrusted, Chain: res.Chain, Count: res.Count, Reason: termsafe.String(problems[0]) + more, Warnings: res.Warnings}
	}
	fmt.Fprintf(stderr, "note: %d human decisions held to the %s: each counts\n", decisions, scope)
	return res
}

// eachReceipt calls fn with each receipt of one chain file, in either form.
func eachReceipt(src noa.SegmentSource, fn func(noa.Receipt)) error {
	f, err := src.Open()
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	for {
		b, err := br.Peek(1)
		if err != nil || (b[0] != ' ' && b[0] != '\t' && b[0] != '\r' && b[0] != '\n') {
			break
		}
		br.ReadByte()
	}
	if b, err := br.Peek(1); err == nil && b[0] == '[' {
		rs, err := noa.ReadChain(br)
		if err != nil {
			return err
		}
		for _, rc := range rs {
			fn(rc)
		}
		return nil
	}
	lr := noa.NewLineReader(br)
	for {
		rc, err := lr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		fn(rc)
	}
}

// readBounded reads a whole file, refusing one larger than limit.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}
