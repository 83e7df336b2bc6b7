package reviewlog

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

// Rule ids the guard's receipts carry for honoured human decisions.
const (
	RuleHumanApproved = "human_approved"
	RuleHumanRejected = "human_rejected"
	RuleHumanReview   = "human_review"
)

// How a trusted decision was proven (Review.DecidedWith).
const (
	DecidedWithKey     = "reviewer_key"
	DecidedWithPasskey = "passkey"
)

// ActionID is the action id every receipt about a review carries.
func ActionID(reviewID string) string { return "review:" + reviewID }

// signed is what the chains prove about one review.
type signed struct {
	receipts []noa.Receipt // every receipt of the review, in chain order
	ids      []string
	human    *noa.Receipt // the first receipt of a trusted reviewer's decision
	// decisions are every trusted reviewer's decision receipt, in chain
	// order (a review with a quorum reads them all).
	decisions []*noa.Receipt
	terms     *noa.Receipt // the first service receipt of rule review_terms
	uses      []noa.Receipt
	problems  []string
	// tenant is the log's tenant ("" on a single root): terms that name
	// another do not count here.
	tenant string
}

// signedFor reads the receipts of review r: its trusted human decision, the
// server's signed terms, the honoured uses of an approval, and every human
// receipt that does not hold.
func signedFor(rcs []noa.Receipt, trusted trustSet, quorum int) signed {
	s := signed{receipts: rcs, tenant: trusted.tenant}
	for i, rc := range rcs {
		s.ids = append(s.ids, rc.ID)
		g := rc.Governance
		switch {
		case rc.Agent.Principal == noa.PrincipalHuman:
			if why := humanProblem(rc, trusted); why != "" {
				s.problems = append(s.problems, fmt.Sprintf("human receipt %s does not count: %s", rc.ID, why))
				continue
			}
			s.decisions = append(s.decisions, &rcs[i])
			if s.human == nil {
				s.human = &rcs[i]
			} else if quorum > 1 {
				// Several approvals are the rule here: resolveQuorum reads them.
			} else if s.human.Governance.Verdict != g.Verdict {
				s.problems = append(s.problems, fmt.Sprintf("human receipt %s contradicts the earlier decision %s; the earlier one stands", rc.ID, s.human.ID))
			}
		case g.Verdict == noa.VerdictDeferred && g.RuleID != nil && *g.RuleID == RuleReviewTerms:
			if s.terms == nil {
				s.terms = &rcs[i]
			}
		case g.Verdict == noa.VerdictAllowed && g.RuleID != nil && *g.RuleID == RuleHumanApproved:
			s.uses = append(s.uses, rc)
		}
	}
	return s
}

// trustSet is what decides whether a HUMAN receipt is a trusted decision: the
// reviewers' own keys, their passkeys, and the server's keyring (which
// seals the receipt of a decision a passkey made).
type trustSet struct {
	reviewers Reviewers
	passkeys  Passkeys
	// server reads the server's keyring, holding kid where the store
	// does (only when a passkey's decision is to be checked).
	server func(kid string) (noa.Keyring, error)
	// tenant, when set, is the tenant of a --tenants-dir server whose log
	// is read: a decision counts only by a reviewer grants allows it.
	tenant string
	grants Grants
}

// humanProblem says why a HUMAN receipt is no trusted decision ("" when it
// is one). Which terms it decides is checked by resolve: a passkey's
// assertion signs the receipt's paramsHash, which resolve holds to the
// DecisionHash of the review's signed terms, decision and note.
func humanProblem(rc noa.Receipt, trusted trustSet) string {
	g := rc.Governance
	if g.Verdict != noa.VerdictAllowed && g.Verdict != noa.VerdictBlocked {
		return "its verdict " + g.Verdict + " is no decision"
	}
	if g.Approval == nil || g.Approval.By != rc.Agent.ID {
		return "its approval does not name the reviewer that signed it"
	}
	a, isPasskey, err := passkey.DecodeModel(rc.Agent.Model)
	if err != nil {
		return err.Error()
	}
	if isPasskey {
		if why := passkeyProblem(rc, a, trusted); why != "" {
			return why
		}
		return grantProblem(rc.Agent.ID, trusted)
	}
	key, ok := trusted.reviewers[rc.Agent.ID]
	if !ok {
		return fmt.Sprintf("reviewer %q is not in the trusted reviewers file", clip(rc.Agent.ID))
	}
	if err := noa.VerifySignature(rc, key); err != nil {
		return fmt.Sprintf("not signed by reviewer %q's trusted key (%v)", clip(rc.Agent.ID), err)
	}
	return grantProblem(rc.Agent.ID, trusted)
}

// grantProblem says why reviewer may not decide for the log's tenant (""
// when they may, or when the log is a single root's).
func grantProblem(reviewer string, trusted trustSet) string {
	if trusted.tenant == "" || trusted.grants.Allows(reviewer, trusted.tenant) {
		return ""
	}
	return fmt.Sprintf("reviewer %q is trusted, but the trusted reviewers file does not grant them tenant %q", clip(reviewer), clip(trusted.tenant))
}

// granted reports whether reviewer may decide on this log now: always on a
// single root; with Options.Tenant, when the trusted reviewers file grants
// them that tenant. A grants file that cannot be read grants nothing.
func (l *Log) granted(reviewer string) (bool, error) {
	if l.tenant == "" {
		return true, nil
	}
	if l.grants == nil {
		return false, nil
	}
	g, err := l.grants()
	if err != nil {
		return false, fmt.Errorf("the trusted reviewers file's tenant grants cannot be read: %w", err)
	}
	return g.Allows(reviewer, l.tenant), nil
}

// passkeyProblem says why the receipt of a passkey's decision does not
// hold: the server's keyring must hold the key that sealed it, and the
// assertion inside must be by a passkey the reviewers file lists for the
// receipt's reviewer, over the receipt's paramsHash.
func passkeyProblem(rc noa.Receipt, a passkey.Assertion, trusted trustSet) string {
	cred, ok := trusted.passkeys.Find(rc.Agent.ID, a.CredentialID)
	if !ok {
		return fmt.Sprintf("passkey %s is not listed for reviewer %q in the trusted reviewers file", clip(a.CredentialID), clip(rc.Agent.ID))
	}
	if err := passkey.VerifyDecision(cred, a, rc.Action.ParamsHash); err != nil {
		return fmt.Sprintf("reviewer %q's passkey did not sign this decision (%v)", clip(rc.Agent.ID), err)
	}
	if trusted.server == nil {
		return "the server's keyring is not at hand to check the seal"
	}
	kr, err := trusted.server(rc.Sig.KID)
	if err != nil {
		return fmt.Sprintf("the server's keyring cannot be read: %v", err)
	}
	spki, ok := kr[rc.Sig.KID]
	if !ok {
		return fmt.Sprintf("sealed by key %s, which the server's keyring does not hold", clip(rc.Sig.KID))
	}
	key, err := noa.DecodeSPKI(spki)
	if err != nil {
		return fmt.Sprintf("the keyring's key %s cannot be read: %v", clip(rc.Sig.KID), err)
	}
	if err := noa.VerifySignature(rc, key); err != nil {
		return fmt.Sprintf("not sealed by the server's key %s (%v)", clip(rc.Sig.KID), err)
	}
	return ""
}

// A finding about one review: what it says, and whether a crash can leave
// it (a receipt is committed before its log line on the file store) or only
// tampering makes it.
type finding struct {
	what  string
	crash bool
}

// TamperedPrefix starts every integrity finding that only tampering with
// an unsigned record can make.
const TamperedPrefix = "TAMPERED: "

// checkTerms compares the review's unsigned opened line with the terms the
// server signed (receipt s.terms, verified with keys), and says what
// disagrees. It returns the terms hash when the line's terms are the ones
// signed.
func checkTerms(r Review, s signed, keys noa.Keyring) (string, []finding) {
	tampered := func(format string, a ...any) []finding {
		return []finding{{what: TamperedPrefix + fmt.Sprintf(format, a...)}}
	}
	if r.Terms == nil {
		if s.terms != nil {
			return "", tampered("the opened line carries no terms, but receipt %s signs terms for this review", s.terms.ID)
		}
		// Opened by an earlier version: read as the log says, never
		// decided, never honoured (the agent's next question opens a
		// review that can be).
		return "", nil
	}
	t := *r.Terms
	th, err := TermsHash(t)
	if err != nil {
		return "", tampered("the opened line's terms cannot be read: %v", err)
	}
	var out []finding
	for _, c := range []struct{ name, line, terms string }{
		{"review_id", r.ID, t.ReviewID}, {"caller", r.Caller, t.Caller}, {"counterparty", r.Counterparty, t.Counterparty},
		{"amount", r.Amount, t.Amount}, {"asset", r.Asset, t.Asset}, {"template", r.Template, t.Template},
		{"params_hash", r.ParamsHash, t.ParamsHash},
		{"rules", strings.Join(ReviewRules(r.Reasons), ","), strings.Join(t.Rules, ",")},
	} {
		if c.line != c.terms {
			out = append(out, tampered("the opened line's %s %q is not its terms' %q", c.name, clip(c.line), clip(c.terms))...)
		}
	}
	if s.terms == nil {
		return "", append(out, tampered("no receipt the server signed holds this review's terms (its %s receipt is missing)", RuleReviewTerms)...)
	}
	rc := s.terms
	if pub, ok := keys[rc.Sig.KID]; !ok {
		out = append(out, tampered("receipt %s, which should sign the terms, is signed by key %s, which the keyring does not hold", rc.ID, clip(rc.Sig.KID))...)
	} else if key, err := noa.DecodeSPKI(pub); err != nil {
		out = append(out, tampered("the keyring's key %s cannot be read: %v", clip(rc.Sig.KID), err)...)
	} else if err := noa.VerifySignature(*rc, key); err != nil {
		out = append(out, tampered("receipt %s, which should sign the terms, does not verify: %v", rc.ID, err)...)
	}
	if rc.Action.ParamsHash != th {
		out = append(out, tampered("the terms in the log (hash %s) are not the terms the server signed in receipt %s (%s)", th, rc.ID, rc.Action.ParamsHash)...)
	}
	if rc.Agent.ID != t.Caller {
		out = append(out, tampered("the terms name caller %q, the server signed caller %q (receipt %s)", clip(t.Caller), clip(rc.Agent.ID), rc.ID)...)
	}
	tenant := ""
	if rc.Scope.Tenant != nil {
		tenant = *rc.Scope.Tenant
	}
	if tenant != t.Tenant {
		out = append(out, tampered("the terms name tenant %q, the server signed tenant %q (receipt %s)", clip(t.Tenant), clip(tenant), rc.ID)...)
	}
	if s.tenant != "" && t.Tenant != s.tenant {
		// The server signs the same terms for every tenant with one key:
		// only the tenant they name keeps a review in its own store.
		out = append(out, tampered("the terms are for tenant %q, but this is tenant %q's review log (a review moved between tenants' stores counts in neither)", clip(t.Tenant), clip(s.tenant))...)
	}
	if len(out) > 0 {
		return "", out
	}
	return th, nil
}

// decidedInTime says whether a decision signed at decided came before the
// review opened at opened expired under ttl. A time that cannot be read is
// not in time.
func decidedInTime(opened, decided string, ttl time.Duration) bool {
	o, err1 := time.Parse(time.RFC3339Nano, opened)
	d, err2 := time.Parse(time.RFC3339Nano, decided)
	return err1 == nil && err2 == nil && d.Before(o.Add(ttl))
}

// resolve is a review as the signatures prove it: approved or rejected only
// with a trusted reviewer's receipt that signs the review's signed terms
// (a rejection holds even where it signs other terms than the log now
// shows), unverified where the log alone says so, expired when pending past
// ttl. It returns the findings with their class.
func resolve(r Review, s signed, keys noa.Keyring, now time.Time, ttl time.Duration) (Review, []finding) {
	out := r
	out.Integrity, out.Tampered, out.bound = nil, false, false
	th, fs := checkTerms(r, s, keys)
	out.TermsHash = th
	if th != "" {
		out.TermsReceipt = s.terms.ID
	}
	add := func(f finding) { fs = append(fs, f) }
	if r.Terms != nil && r.Terms.Quorum() > 1 {
		out.Approvals = r.Terms.Quorum()
		resolveQuorum(r, s, th, now, ttl, &out, add)
	} else if s.human != nil {
		out.DecidedWith = DecidedWithKey
		if _, pk, _ := passkey.DecodeModel(s.human.Agent.Model); pk {
			out.DecidedWith = DecidedWithPasskey
		}
		status := Rejected
		if s.human.Governance.Verdict == noa.VerdictAllowed {
			status = Approved
		}
		ph := s.human.Action.ParamsHash
		switch {
		case th != "":
			want, err := DecisionHash(th, status, r.Note)
			switch {
			case err == nil && ph == want:
				out.bound = true
			case r.Status == Pending:
				add(finding{what: fmt.Sprintf("receipt %s signs a %s decision the log does not hold, so the note it signed cannot be checked", s.human.ID, status), crash: true})
			default:
				add(finding{what: TamperedPrefix + fmt.Sprintf("the %s decision of receipt %s signs other terms or another note than the log holds", status, s.human.ID)})
			}
		case r.Terms == nil && r.ParamsHash != "" && ph == r.ParamsHash:
			out.bound = true // an earlier version's decision: read, never honoured
		}
		if status == Approved && out.bound && ttl > 0 && s.terms != nil && !decidedInTime(s.terms.TS, s.human.Governance.Approval.At, ttl) {
			// The reviewer's own program judged the review by a time to live
			// read from the store, which a store writer can lengthen; the
			// server's own ttl is what an approval is held to.
			out.bound = false
			out.Status, out.DecidedBy, out.DecidedAt, out.Note = Expired, s.human.Agent.ID, s.human.Governance.Approval.At, ""
			add(finding{what: fmt.Sprintf("the approval of receipt %s was signed after the review expired (time to live %s): it does not count", s.human.ID, ttl)})
		} else if status == Approved && !out.bound && (r.Status != Pending || th == "" && r.Terms != nil) {
			// An approval counts only for the terms it signed. (Where the
			// log lacks the decided line — a write in flight, or cut short
			// by a crash — the approval reads as signed but is not bound,
			// so it is honoured only once its line is there.)
			out.Status, out.DecidedBy, out.DecidedAt, out.Note = Unverified, s.human.Agent.ID, s.human.Governance.Approval.At, ""
			add(finding{what: fmt.Sprintf("the approval of receipt %s does not count: it does not sign the terms of this review as signed by the server", s.human.ID)})
		} else {
			if r.Status != status {
				if r.Status == Pending {
					add(finding{what: fmt.Sprintf("the log does not record the %s decision that receipt %s signs", status, s.human.ID), crash: true})
				} else {
					add(finding{what: TamperedPrefix + fmt.Sprintf("the log says %s, but the signed decision (receipt %s) is %s", r.Status, s.human.ID, status)})
				}
				out.Note = ""
			}
			out.Status, out.DecidedBy, out.DecidedAt = status, s.human.Agent.ID, s.human.Governance.Approval.At
		}
	} else if r.Status == Approved || r.Status == Rejected {
		add(finding{what: TamperedPrefix + fmt.Sprintf("the log says %s by %s, but no receipt signed by a trusted reviewer records it", r.Status, clip(r.DecidedBy))})
		out.Status = Unverified
	} else if ttl > 0 {
		if t, err := parseTime(r.CreatedAt); err == nil && !now.Before(t.Add(ttl)) {
			out.Status = Expired
		}
	}
	if len(s.uses) > 0 && out.UsedAt == "" {
		out.UsedAt = s.uses[0].TS
		add(finding{what: fmt.Sprintf("the log does not record the use that receipt %s signs", s.uses[0].ID), crash: true})
	}
	if out.UsedAt != "" && out.Status != Approved {
		add(finding{what: "an approval was used that no trusted reviewer signed"})
	}
	for _, p := range s.problems {
		add(finding{what: p})
	}
	for _, f := range fs {
		out.Integrity = append(out.Integrity, f.what)
		if strings.HasPrefix(f.what, TamperedPrefix) {
			out.Tampered = true
		}
	}
	return out, fs
}

// resolveQuorum is resolve for a review whose signed terms need n > 1
// approvals (the two-person rule). Each trusted reviewer counts once,
// whether they signed with a key or a passkey, and however often they
// signed. An approval that does not complete the quorum signs the terms
// with an empty note and writes no log line; the one that completes it
// writes the decided line, whose note it signs. The review is approved,
// and its approval usable, only when n distinct reviewers' approvals sign
// its signed terms and the log records the decision; a trusted rejection
// rejects it whatever approvals came before (it is never lifted by an
// unsigned record, as in resolve). th is "" when the terms in the log are
// not the ones the server signed: then no approval counts.
func resolveQuorum(r Review, s signed, th string, now time.Time, ttl time.Duration, out *Review, add func(finding)) {
	n := r.Terms.Quorum()
	// In the order the reviewers signed (each reviewer signs into a chain
	// of their own, so chain order says nothing across them).
	s.decisions = slices.Clone(s.decisions)
	slices.SortStableFunc(s.decisions, func(a, b *noa.Receipt) int {
		return strings.Compare(a.Governance.Approval.At, b.Governance.Approval.At)
	})
	// One rejection rejects: the first a trusted reviewer signed stands.
	for _, rc := range s.decisions {
		if rc.Governance.Verdict != noa.VerdictBlocked {
			continue
		}
		out.DecidedWith = decidedWith(rc)
		if th != "" {
			if want, err := DecisionHash(th, Rejected, r.Note); err == nil && rc.Action.ParamsHash == want && r.Status == Rejected {
				out.bound = true
			}
		}
		switch {
		case r.Status == Pending:
			add(finding{what: fmt.Sprintf("the log does not record the rejected decision that receipt %s signs", rc.ID), crash: true})
			out.Note = ""
		case r.Status != Rejected:
			add(finding{what: TamperedPrefix + fmt.Sprintf("the log says %s, but a trusted reviewer's signed rejection (receipt %s) rejects the review", r.Status, rc.ID)})
			out.Note = ""
		case !out.bound:
			add(finding{what: TamperedPrefix + fmt.Sprintf("the rejected decision of receipt %s signs other terms or another note than the log holds", rc.ID)})
		}
		out.Status, out.DecidedBy, out.DecidedAt = Rejected, rc.Agent.ID, rc.Governance.Approval.At
		out.ApprovedBy = countedApprovals(r, s, th, ttl, nil)
		return
	}
	var last *noa.Receipt
	out.ApprovedBy = countedApprovals(r, s, th, ttl, func(rc *noa.Receipt, why string) {
		if why != "" {
			add(finding{what: fmt.Sprintf("the approval of receipt %s does not count: %s", rc.ID, why)})
			return
		}
		last = rc
	})
	have := len(out.ApprovedBy)
	switch {
	case have >= n && r.Status == Approved:
		out.bound = true
		out.Status, out.DecidedBy, out.DecidedAt = Approved, last.Agent.ID, last.Governance.Approval.At
		out.DecidedWith = decidedWith(last)
	case have >= n && r.Status == Pending:
		// Complete in the signatures, but the decided line is not there
		// (a write in flight, or cut short by a crash): read as signed,
		// never honoured until the line is.
		add(finding{what: fmt.Sprintf("the log does not record the approval that %d reviewers signed", have), crash: true})
		out.Status, out.DecidedBy, out.DecidedAt = Approved, last.Agent.ID, last.Governance.Approval.At
		out.DecidedWith = decidedWith(last)
	case r.Status == Approved || r.Status == Rejected:
		add(finding{what: TamperedPrefix + fmt.Sprintf("the log says %s by %s, but %s", r.Status, clip(r.DecidedBy), QuorumText(*out))})
		out.Status, out.Note = Unverified, ""
	case ttl > 0:
		if t, err := parseTime(r.CreatedAt); err == nil && !now.Before(t.Add(ttl)) {
			out.Status = Expired
		}
	}
}

// countedApprovals lists the distinct trusted reviewers whose approval of
// r counts, in chain order, telling each approval receipt to seen ("" when
// it counts, else why not; nil: tell nothing). A reviewer's second
// approval counts once.
func countedApprovals(r Review, s signed, th string, ttl time.Duration, seen func(rc *noa.Receipt, why string)) []string {
	var by []string
	partial, _ := DecisionHash(th, Approved, "")
	final := ""
	if r.Status == Approved {
		final, _ = DecisionHash(th, Approved, r.Note)
	}
	for _, rc := range s.decisions {
		if rc.Governance.Verdict != noa.VerdictAllowed {
			continue
		}
		why := ""
		switch {
		case th == "":
			why = "the review's terms in the log are not the ones the server signed"
		case rc.Action.ParamsHash != partial && (final == "" || rc.Action.ParamsHash != final):
			why = "it does not sign the terms of this review as signed by the server (or the note the log holds)"
		case ttl > 0 && s.terms != nil && !decidedInTime(s.terms.TS, rc.Governance.Approval.At, ttl):
			why = fmt.Sprintf("it was signed after the review expired (time to live %s)", ttl)
		case slices.Contains(by, rc.Agent.ID):
			why = fmt.Sprintf("reviewer %q approved this review already, and counts once", clip(rc.Agent.ID))
		}
		if why == "" {
			by = append(by, rc.Agent.ID)
		}
		if seen != nil {
			seen(rc, why)
		}
	}
	return by
}

// decidedWith says how a trusted decision receipt was proven.
func decidedWith(rc *noa.Receipt) string {
	if _, pk, _ := passkey.DecodeModel(rc.Agent.Model); pk {
		return DecidedWithPasskey
	}
	return DecidedWithKey
}

// QuorumText says how far a review with a quorum is: "1 of 2 approvals
// (alice)", "0 of 2 approvals", "2 of 2 approvals (alice, bob)"; "" when
// one approval suffices.
func QuorumText(r Review) string {
	if r.Approvals <= 1 {
		return ""
	}
	s := fmt.Sprintf("%d of %d approvals", len(r.ApprovedBy), r.Approvals)
	if len(r.ApprovedBy) > 0 {
		s += " (" + strings.Join(r.ApprovedBy, ", ") + ")"
	}
	return s
}

// verifier resolves reviews against the chains of one guard/ directory.
type verifier struct {
	ctx context.Context
	r   Reader
	rx  *receiptIndex
	// src is the store's receipt index (nil: rx, the fold, answers).
	src     *indexSource
	trusted trustSet
	now     time.Time
	ttl     time.Duration
	// keys verify the server's signed terms: Options.ServerKeys (then
	// fixedKeys), or the store's keyring, read the first time a review's
	// terms need it.
	keys      noa.Keyring
	fixedKeys bool
	// problem is set when the trusted reviewers could not be read.
	problem string
}

// newVerifier reads the trusted reviewers, and readies the receipts: the
// store's own receipt index when r has one (ReceiptIndex), the receipt
// index brought up to date otherwise. l.mu is held.
func (l *Log) newVerifier(ctx context.Context, r Reader) (*verifier, error) {
	if idx, ok := r.(ReceiptIndex); ok {
		l.rx.live = &indexSource{ctx: ctx, idx: idx, unchecked: l.rx.unchecked, cache: &l.rx.reserving}
		return l.verifierOver(ctx, r), nil
	}
	return l.newFoldVerifier(ctx, r)
}

// newFoldVerifier is newVerifier over the fold of every chain segment,
// whatever the store indexes: for the readers that read every receipt
// (the audit) or every review (List).
func (l *Log) newFoldVerifier(ctx context.Context, r Reader) (*verifier, error) {
	l.rx.live = nil
	if err := l.rx.refresh(ctx, r); err != nil {
		return nil, fmt.Errorf("read decision chains: %w", err)
	}
	return l.verifierOver(ctx, r), nil
}

func (l *Log) verifierOver(ctx context.Context, r Reader) *verifier {
	v := &verifier{ctx: ctx, r: r, rx: &l.rx, src: l.rx.live, trusted: trustSet{reviewers: Reviewers{}, passkeys: Passkeys{}}, now: l.now(), ttl: l.ttl(), keys: l.serverKeys, fixedKeys: l.serverKeys != nil}
	v.trusted.server = v.keysWith
	if l.trust != nil {
		l.trustedOnce(v)
		return v
	}
	if l.reviewers != nil {
		// A trusted reviewers file that cannot be read trusts no one: every
		// decision then reads unverified (fail closed), and says why.
		rs, err := l.reviewers()
		if err != nil {
			v.problem = fmt.Sprintf("the trusted reviewers file cannot be read, so no decision can be verified: %v", err)
		} else {
			v.trusted.reviewers = rs
		}
	}
	if l.passkeys != nil {
		pk, err := l.passkeys()
		if err != nil {
			v.problem = fmt.Sprintf("the trusted reviewers file's passkeys cannot be read, so no decision can be verified: %v", err)
			v.trusted.reviewers = Reviewers{}
		} else {
			v.trusted.passkeys = pk
		}
	}
	if l.tenant != "" {
		// A tenant's log trusts only the reviewers granted the tenant;
		// grants that cannot be read grant no one (fail closed).
		v.trusted.tenant, v.trusted.grants = l.tenant, Grants{}
		if l.grants != nil {
			g, err := l.grants()
			if err != nil {
				v.problem = fmt.Sprintf("the trusted reviewers file's tenant grants cannot be read, so no decision can be verified: %v", err)
				v.trusted.reviewers, v.trusted.passkeys = Reviewers{}, Passkeys{}
			} else {
				v.trusted.grants = g
			}
		}
	}
	return v
}

// trustedOnce fills v's trusted reviewers from one reading of the trusted
// reviewers file (Options.Trust). A file that cannot be read trusts no one
// and grants nothing: every decision then reads unverified (fail closed),
// and says why.
func (l *Log) trustedOnce(v *verifier) {
	t, err := l.trust()
	if l.tenant != "" {
		v.trusted.tenant, v.trusted.grants = l.tenant, Grants{}
	}
	if err != nil {
		v.problem = fmt.Sprintf("the trusted reviewers file cannot be read, so no decision can be verified: %v", err)
		return
	}
	if t.Reviewers != nil {
		v.trusted.reviewers = t.Reviewers
	}
	if t.Passkeys != nil {
		v.trusted.passkeys = t.Passkeys
	}
	if l.tenant != "" && t.Grants != nil {
		v.trusted.grants = t.Grants
	}
}

// keyring is the keys that verify s's signed terms (nil when s holds
// none, so most answers never read the keyring).
func (v *verifier) keyring(s signed) (noa.Keyring, error) {
	if s.terms == nil {
		return v.keys, nil
	}
	return v.keysWith(s.terms.Sig.KID)
}

// keysWith is the server's keys, holding kid where the store does: as
// the store's section read them (KeyringCache: from its process's earlier
// reading while that holds kid), else loadKeys.
func (v *verifier) keysWith(kid string) (noa.Keyring, error) {
	if v.fixedKeys {
		return v.keys, nil
	}
	if _, ok := v.keys[kid]; ok {
		return v.keys, nil
	}
	c, ok := v.r.(KeyringCache)
	if !ok {
		return v.loadKeys()
	}
	kr, err := c.KeyringWith(v.ctx, kid)
	if err != nil {
		return nil, fmt.Errorf("read the keyring: %w", err)
	}
	v.keys = kr
	return kr, nil
}

// loadKeys is the server's keys: Options.ServerKeys, or the store's
// keyring read once.
func (v *verifier) loadKeys() (noa.Keyring, error) {
	if v.keys != nil {
		return v.keys, nil
	}
	kr, err := v.r.Keyring(v.ctx)
	if err != nil {
		return nil, fmt.Errorf("read the keyring: %w", err)
	}
	v.keys = kr
	return kr, nil
}

// signed reads what the chains prove about r.
func (v *verifier) signed(r *Review) (signed, error) {
	rcs, err := v.receipts(ActionID(r.ID))
	if err != nil {
		return signed{}, err
	}
	quorum := 1
	if r.Terms != nil {
		quorum = r.Terms.Quorum()
	}
	s := signedFor(rcs, v.trusted, quorum)
	if v.problem != "" && (r.Status != Pending || len(s.problems) > 0) {
		s.problems = append(s.problems, v.problem)
	}
	return s, nil
}

// receipts are the receipts of action, in chain order.
func (v *verifier) receipts(action string) ([]noa.Receipt, error) {
	if v.src != nil {
		rcs, err := v.src.actionReceipts(action)
		if err != nil {
			return nil, fmt.Errorf("read the decision chains' receipt index: %w", err)
		}
		return rcs, nil
	}
	return v.rx.receipts(v.ctx, v.r, action)
}

// reviewsOf lists the action ids of the reviews the chains say answered
// caller's question, oldest first.
func (v *verifier) reviewsOf(caller, paramsHash string) ([]string, error) {
	if v.src != nil {
		ids, err := v.src.reviewsOf(caller, paramsHash)
		if err != nil {
			return nil, fmt.Errorf("read the decision chains' receipt index: %w", err)
		}
		return ids, nil
	}
	return v.rx.reviewsOf(caller, paramsHash), nil
}

// resolve is r as the signatures prove it, with its receipt ids.
func (v *verifier) resolve(r *Review) (Review, []string, error) {
	s, err := v.signed(r)
	if err != nil {
		return Review{}, nil, err
	}
	ids := s.ids
	if ids == nil {
		ids = []string{}
	}
	keys, err := v.keyring(s)
	if err != nil {
		return Review{}, nil, err
	}
	out, _ := resolve(*r, s, keys, v.now, v.ttl)
	return out, ids, nil
}

// Verified is one review as the signatures prove it, with the ids of the
// receipts that record it.
func (l *Log) Verified(ctx context.Context, id string) (Review, []string, error) {
	if err := checkID(id); err != nil {
		return Review{}, nil, err
	}
	var out Review
	var ids []string
	err := l.view(ctx, func(g Reader, st *state) error {
		e := st.byID[id]
		if e == nil {
			// An id the guard gave out stays answerable once archived.
			ast, err := l.findArchived(ctx, g, id)
			if err != nil {
				return err
			}
			if ast == nil {
				return fmt.Errorf("%w: %s", ErrUnknownReview, id)
			}
			st, e = ast, ast.byID[id]
		}
		r, err := st.review(e)
		if err != nil {
			return err
		}
		v, err := l.newVerifier(ctx, g)
		if err != nil {
			return err
		}
		out, ids, err = v.resolve(&r)
		return err
	})
	return out, ids, err
}

// Findings are the log's contradicting lines, for the audit (at most
// maxFindings of them; total counts them all).
func (l *Log) Findings(ctx context.Context) (findings []Finding, err error) {
	err = l.view(ctx, func(_ Reader, st *state) error {
		findings = append([]Finding(nil), st.findings...)
		return nil
	})
	return findings, err
}

// findArchived folds the archive that holds review id (nil when none does).
// Which archive holds which id is remembered (archives never change), and
// the last archive folded is kept, so an archived review asked about again
// costs no read. l.mu is held.
func (l *Log) findArchived(ctx context.Context, g Reader, id string) (*state, error) {
	names, err := g.Archives(ctx)
	if err != nil {
		return nil, err
	}
	if l.archived == nil {
		l.archived = map[string]string{}
		l.archivesRead = map[string]bool{}
	}
	if name, ok := l.archived[id]; ok && slices.Contains(names, name) {
		if l.lastArchive != nil && l.lastArchiveName == name {
			return l.lastArchive, nil
		}
		ast, err := foldArchive(ctx, g, name)
		if err != nil {
			return nil, fmt.Errorf("archive %s: %w", name, err)
		}
		l.lastArchive, l.lastArchiveName = ast, name
		return ast, nil
	}
	for i := len(names) - 1; i >= 0; i-- {
		name := names[i]
		if l.archivesRead[name] {
			continue
		}
		ast, err := foldArchive(ctx, g, name)
		if err != nil {
			return nil, fmt.Errorf("archive %s: %w", name, err)
		}
		l.archivesRead[name] = true
		for _, e := range ast.entries {
			l.archived[e.id] = name
		}
		if ast.byID[id] != nil {
			l.lastArchive, l.lastArchiveName = ast, name
			return ast, nil
		}
	}
	return nil, nil
}
