package guard

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cockroachdb/apd/v3"
)

// Config is the guard policy, read once at start. Amounts are integer
// atomic units of DefaultAsset; nothing in a request or an event can change
// a Config after it is built.
type Config struct {
	// Allowlist, when non-empty, sends every other counterparty to review.
	Allowlist []Counterparty
	// Denylist blocks its counterparties outright.
	Denylist []Counterparty
	// Limit caps the spend to one counterparty inside a sliding window.
	Limit Limit
	// MaxOpenPartial is how many paid-but-unsettled operations with one
	// counterparty are tolerated before the next payment goes to review.
	MaxOpenPartial int
	// ReviewAbove sends any single payment larger than this to review.
	ReviewAbove *big.Int
	// Quorum is the two-person rule: a review of a payment above a tier's
	// amount needs that many approvals from distinct trusted reviewers.
	// Sorted by Above, each Above once; empty when the policy sets none.
	Quorum []QuorumTier
	// ReviewNewPayee sends a payment to a payee that neither the Trace nor
	// the spend ledger has seen for the tenant to review: a person confirms
	// each new payee once, and the payment the approval allows makes it
	// known.
	ReviewNewPayee bool
	// Payees are the operator's names of payee addresses (canonical lower-
	// case 0x address → name), shown beside the address for people. A name
	// is display only: every rule matches by address.
	Payees map[string]string
	// DefaultAsset is the asset every policy amount is expressed in.
	DefaultAsset Asset
	// Assets is the registry: the built-in USDC deployments plus the file's own.
	Assets Registry
	// PolicyFile is the noa.policy/0.2 custom-rules file named by "policy",
	// resolved against the config file's directory; empty when none.
	PolicyFile string
	// Source names where the policy came from, for messages.
	Source string
	// Text is the policy file's bytes and Hash their hex SHA-256; both are
	// empty for the built-in defaults.
	Text []byte
	Hash string

	// HistoryTemplates are the templates past operations are read under;
	// the guard takes the worst case over them. A caller cannot choose.
	HistoryTemplates []string
	// UnreadableHistory and UnattributableHistory say what an unreadable
	// run and an open operation that cannot be attributed do: Review (the
	// default) or Ignore.
	UnreadableHistory     string
	UnattributableHistory string

	// ReviewTTL: a pending review expires after it. ApprovalTTL: an
	// approval is honoured on the identical retry within it. RejectionHold:
	// a rejection blocks the identical question within it.
	ReviewTTL     time.Duration
	ApprovalTTL   time.Duration
	RejectionHold time.Duration
	// MaxPendingReviews caps the pending reviews one caller may hold.
	MaxPendingReviews int
	// MaxAuthorizationSeconds caps how long an x402 authorization the
	// guard signs stays valid (the seller's maxTimeoutSeconds, at most this).
	MaxAuthorizationSeconds int
	// ReservationTTL: an allow reserves its payment until the Trace shows
	// it or this long has passed.
	ReservationTTL time.Duration

	// TotalLimit caps the spend to every counterparty together inside a
	// sliding window; nil when the policy sets none.
	TotalLimit *Limit
	// Velocity caps how many payments fall inside a window.
	Velocity Velocity
	// DuplicateWindow: a payment for a resource already paid for inside it
	// goes to review; 0 when the policy sets none.
	DuplicateWindow time.Duration
	// RequireSignedOffers: every 402 paid must carry a signed offer
	// (signed_offer); RequireSignedOffersFrom names the counterparties
	// that must, when not every one must.
	RequireSignedOffers     bool
	RequireSignedOffersFrom []Counterparty
	// SellerKeys are the keys trusted to sign offers and receipts, each
	// for one counterparty.
	SellerKeys []SellerKey

	// Allowlisting is true when some layer named a non-empty allowlist: then
	// every counterparty not on Allowlist goes to review, even when the
	// layers' lists have nothing in common and Allowlist is empty.
	Allowlisting bool

	// Layers names every layer composed into this policy, widest first:
	// "defaults", "file", "tenant T", "agent A", "tenant T agent A".
	Layers []string
	// Agent is the caller id whose own policy this is ("" when no agent
	// layer applies); Agents are those policies, each complete, by caller
	// id.
	Agent  string
	Agents map[string]*Config
	// Tenants are the policies of each tenant (--tenants-dir), each the
	// file's policy with the tenant's layer composed over it; their Agents
	// compose the agent layers over the tenant's.
	Tenants map[string]*Config
}

// QuorumTier is one entry of the policy key quorum: a review of a payment
// of more than Above (atomic units of the default asset) needs Approvals
// approvals from distinct trusted reviewers.
type QuorumTier struct {
	Above     *big.Int
	Approvals int
}

// Bounds of the key quorum.
const (
	maxQuorumTiers     = 16
	maxQuorumApprovals = 20
)

// ApprovalsFor is how many distinct reviewers must approve a review of a
// payment of atomic units of the policy's default asset: the largest
// approvals of the tiers the amount is above, 1 when none. known is false
// when the amount cannot be read in the policy's asset; then no threshold
// can be compared, and the largest quorum of any tier applies.
func (c *Config) ApprovalsFor(atomic *big.Int, known bool) int {
	n := 1
	for _, t := range c.Quorum {
		if (!known || atomic == nil || atomic.Cmp(t.Above) > 0) && t.Approvals > n {
			n = t.Approvals
		}
	}
	return n
}

// Velocity caps the number of payments in a window, to one counterparty and
// to all of them; each is nil when the policy sets none.
type Velocity struct {
	PerCounterparty *CountLimit
	Total           *CountLimit
}

// CountLimit allows at most Count payments, this one included, inside Window.
type CountLimit struct {
	Count  int
	Window time.Duration
}

// ForTenant is the policy of one tenant: its own under tenants, else the
// default.
func (c *Config) ForTenant(name string) *Config {
	if t, ok := c.Tenants[name]; ok {
		return t
	}
	return c
}

// For is the policy that answers caller: its own under agents, else the
// default.
func (c *Config) For(caller string) *Config {
	if a, ok := c.Agents[caller]; ok {
		return a
	}
	return c
}

// Name says which layers make this policy, widest first, for the history
// line: "defaults + file + tenant acme + agent bot".
func (c *Config) Name() string {
	if len(c.Layers) == 0 {
		return LayerDefaults
	}
	return strings.Join(c.Layers, " + ")
}

// The names of the policy's layers, in the order they compose.
const (
	LayerDefaults = "defaults"
	LayerFile     = "file"
)

// What an unreadable or unattributable history does.
const (
	Ignore = "ignore"
)

// Defaults of the keys added since version 1.
const (
	defaultReviewTTL         = 24 * time.Hour
	defaultApprovalTTL       = time.Hour
	defaultRejectionHold     = 24 * time.Hour
	defaultMaxPendingReviews = 20
	// DefaultMaxAuthorizationSeconds is maxAuthorizationSeconds unset.
	DefaultMaxAuthorizationSeconds = 300
	maxAuthorizationSecondsCap     = 86400
	maxHistoryTemplates            = 16
	defaultReservationTTL          = 15 * time.Minute
	// MaxReservationTTL bounds reservationMinutes (a day).
	MaxReservationTTL = 24 * time.Hour
)

// Limit is the per-counterparty spending limit.
type Limit struct {
	Amount *big.Int
	Window time.Duration
}

// Defaults of SPEC §6.
const (
	defaultLimitAmount = "5.00"
	defaultWindowHours = 24
	defaultReviewAbove = "1.00"
	maxConfigBytes     = 1 << 20
	maxWindowHours     = 24 * 366 * 10
	maxOpenPartialCap  = 1_000_000
	maxListEntries     = 10_000

	defaultVelocityMinutes  = 60
	defaultDuplicateMinutes = 24 * 60
	maxCount                = 1_000_000
	maxAgents               = 10_000
	maxAgentIDBytes         = 256
)

// ErrConfig marks every policy file problem.
var ErrConfig = errors.New("guard config")

// DefaultConfig is the policy used when no file is given.
func DefaultConfig() *Config {
	c, err := ParseConfig([]byte("{}"), "")
	if err != nil {
		panic("guard: the built-in defaults do not load: " + err.Error()) // a programming error, caught by tests
	}
	c.Source = "built-in defaults"
	c.Layers = []string{LayerDefaults}
	return c
}

// LoadConfig reads the policy file at path (JSON). An empty path gives the
// defaults. The file may be a symbolic link (configuration volumes are made
// of them); it is read once.
func LoadConfig(path string) (*Config, error) {
	if path == "" {
		return DefaultConfig(), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading %s: %w", ErrConfig, path, err)
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrConfig, path, maxConfigBytes)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c, err := ParseConfig(data, filepath.Dir(abs))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c.Source = path
	sum := sha256.Sum256(data)
	c.Text, c.Hash = data, hex.EncodeToString(sum[:])
	return c, nil
}

// ParseConfig builds a Config from the JSON text of a policy file. dir is the
// directory a relative "policy" path is resolved against. A file with
// mistakes gives ConfigErrors: every mistake the loader found, each with
// where it is, not only the first.
func ParseConfig(data []byte, dir string) (*Config, error) {
	c, problems := CheckConfig(data, dir)
	if len(problems) > 0 {
		return nil, problems
	}
	return c, nil
}

// CheckConfig reads a policy file as ParseConfig does and returns every
// mistake in it, with what could be read around them (nil when the file
// is no JSON object): for a checker that goes on to what the server
// checks next (the history templates, the custom rules file). A Config
// with problems is never one to run with.
func CheckConfig(data []byte, dir string) (*Config, ConfigErrors) {
	var ps problems
	c := parseConfig(data, dir, &ps)
	return c, ps.list
}

func parseConfig(data []byte, dir string, ps *problems) *Config {
	top, err := objectMembers(data, "the policy file")
	if err != nil {
		ps.add(Path{}, err)
		return nil
	}
	c := &Config{Assets: newRegistry(), Limit: Limit{Window: defaultWindowHours * time.Hour}, Layers: []string{LayerDefaults, LayerFile},
		HistoryTemplates: []string{DefaultTemplate}, UnreadableHistory: Review, UnattributableHistory: Review,
		ReviewTTL: defaultReviewTTL, ApprovalTTL: defaultApprovalTTL, RejectionHold: defaultRejectionHold,
		MaxPendingReviews: defaultMaxPendingReviews, MaxAuthorizationSeconds: DefaultMaxAuthorizationSeconds,
		ReservationTTL: defaultReservationTTL}

	// Assets and the default asset first: every amount depends on them. A
	// default asset that cannot be read leaves USDC's decimals, so that the
	// amounts are still checked.
	if raw, ok := top.get("assets"); ok {
		c.readAssets(raw, ps)
	}
	c.DefaultAsset, _ = c.Assets.Lookup(USDCBase)
	if raw, ok := top.get("defaultAsset"); ok {
		at := Path{"defaultAsset"}
		if defaultKey, err := readString(raw, "defaultAsset"); err != nil {
			ps.add(at, err)
		} else if _, _, key, err := parseAssetKey(defaultKey); err != nil {
			ps.add(at, fmt.Errorf("%w: defaultAsset: %w", ErrConfig, err))
		} else if def, ok := c.Assets.Lookup(key); !ok {
			ps.add(at, fmt.Errorf("%w: defaultAsset %q is neither a built-in asset nor listed under assets", ErrConfig, clip(defaultKey)))
		} else {
			c.DefaultAsset = def
		}
	}
	def := c.DefaultAsset
	if c.Limit.Amount, err = ParseAmount(defaultLimitAmount, def.Decimals); err != nil {
		ps.add(Path{"defaultAsset"}, fmt.Errorf("%w: perCounterpartyLimit.amount in %s: %w", ErrConfig, def.Symbol, err))
	}
	if c.ReviewAbove, err = ParseAmount(defaultReviewAbove, def.Decimals); err != nil {
		ps.add(Path{"defaultAsset"}, fmt.Errorf("%w: reviewAbove in %s: %w", ErrConfig, def.Symbol, err))
	}

	var agents, tenants json.RawMessage
	for _, m := range top {
		at := Path{m.key}
		if isLimitKey(m.key) || isTenantKey(m.key) {
			c.readLimitKey(m, Path{}, ps)
			continue
		}
		switch m.key {
		case "assets", "defaultAsset":
		case "agents":
			agents = m.value
		case "tenants":
			tenants = m.value
		case "policy":
			p, err := readString(m.value, m.key)
			if err != nil {
				ps.add(at, err)
				continue
			}
			if p == "" {
				ps.add(at, fmt.Errorf("%w: policy must name a file", ErrConfig))
				continue
			}
			if !filepath.IsAbs(p) && dir != "" {
				p = filepath.Join(dir, p)
			}
			c.PolicyFile = p
		case "historyTemplates":
			if names, ok := readTemplateNames(m.value, at, ps); ok {
				c.HistoryTemplates = names
			}
		case "unreadableHistory", "unattributableHistory":
			v, err := readString(m.value, m.key)
			if err != nil {
				ps.add(at, err)
				continue
			}
			if v != Review && v != Ignore {
				ps.add(at, fmt.Errorf("%w: %s must be %q or %q (got %q)", ErrConfig, m.key, Review, Ignore, clip(v)))
				continue
			}
			if m.key == "unreadableHistory" {
				c.UnreadableHistory = v
			} else {
				c.UnattributableHistory = v
			}
		case "reviewTtlMinutes", "approvalTtlMinutes":
			n, err := readInt(m.value, m.key, 1, maxWindowHours*60)
			if err != nil {
				ps.add(at, err)
				continue
			}
			if m.key == "reviewTtlMinutes" {
				c.ReviewTTL = time.Duration(n) * time.Minute
			} else {
				c.ApprovalTTL = time.Duration(n) * time.Minute
			}
		case "rejectionHoldHours":
			n, err := readInt(m.value, m.key, 0, maxWindowHours)
			if err != nil {
				ps.add(at, err)
				continue
			}
			c.RejectionHold = time.Duration(n) * time.Hour
		case "maxPendingReviewsPerCaller":
			n, err := readInt(m.value, m.key, 1, maxOpenPartialCap)
			if err != nil {
				ps.add(at, err)
				continue
			}
			c.MaxPendingReviews = n
		case "maxAuthorizationSeconds":
			n, err := readInt(m.value, m.key, 1, maxAuthorizationSecondsCap)
			if err != nil {
				ps.add(at, err)
				continue
			}
			c.MaxAuthorizationSeconds = n
		case "reservationMinutes":
			n, err := readInt(m.value, m.key, 1, int64(MaxReservationTTL/time.Minute))
			if err != nil {
				ps.add(at, err)
				continue
			}
			c.ReservationTTL = time.Duration(n) * time.Minute
		default:
			ps.add(at, fmt.Errorf("%w: unknown key %q (known: %s)", ErrConfig, clip(m.key), strings.Join(ConfigKeys(), ", ")))
		}
	}
	// Tenants and agents last: each layer composes over the complete
	// policy of the layers before it (see compose).
	var agentLayers []layer
	if agents != nil {
		agentLayers = readAgentLayers(agents, Path{"agents"}, "", ps)
		c.Agents = make(map[string]*Config, len(agentLayers))
		for _, a := range agentLayers {
			c.Agents[a.agent] = c.compose(a, ps)
		}
	}
	if tenants != nil {
		c.readTenants(tenants, agentLayers, ps)
	}
	return c
}

// layer is one layer of the policy as written: its limit keys, in order.
type layer struct {
	name  string // for the history line: "tenant acme", "agent bot"
	at    Path   // where it is in the file: agents["bot"]
	agent string // the caller id of an agent layer
	keys  members
}

// compose returns a copy of c with the layer l over it, key by key: a key l
// does not name keeps c's value; inside an object a nested key not given
// keeps c's; null turns an optional rule off; a denylist adds to c's; an
// allowlist narrows c's (see readLimitKey). The copy shares no list with c.
// A key with a mistake is reported to ps and leaves c's value.
func (c *Config) compose(l layer, ps *problems) *Config {
	out := *c
	out.Agents, out.Tenants = nil, nil
	out.Allowlist = slices.Clone(c.Allowlist)
	out.Denylist = slices.Clone(c.Denylist)
	out.Payees = maps.Clone(c.Payees)
	out.Layers = append(slices.Clip(slices.Clone(c.Layers)), l.name)
	if l.agent != "" {
		out.Agent = l.agent
	}
	for _, m := range l.keys {
		out.readLimitKey(m, l.at, ps)
	}
	return &out
}

func (c *Config) readAssets(raw json.RawMessage, ps *problems) {
	entries, err := objectMembers(raw, "assets")
	if err != nil {
		ps.add(Path{"assets"}, err)
		return
	}
	for _, e := range entries {
		at := Path{"assets", Name(e.key)}
		if err := c.readAsset(e, at); err != nil {
			ps.add(at, err)
		}
	}
}

// readAsset reads one entry of assets, at at.
func (c *Config) readAsset(e member, at Path) error {
	where := at.String()
	network, address, key, err := parseAssetKey(e.key)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrConfig, where, err)
	}
	fields, err := objectMembers(e.value, where)
	if err != nil {
		return err
	}
	a := Asset{Key: key, Network: network, Address: address, Decimals: -1}
	for _, f := range fields {
		switch f.key {
		case "symbol":
			if a.Symbol, err = readString(f.value, where+".symbol"); err != nil {
				return err
			}
			if a.Symbol == "" || len(a.Symbol) > 32 || !allBytes(a.Symbol, func(c byte) bool { return isAlpha(c) || isDigit(c) || c == '.' || c == '-' || c == '_' }) {
				return fmt.Errorf("%w: %s.symbol must be 1 to 32 characters of [A-Za-z0-9._-]", ErrConfig, where)
			}
		case "decimals":
			if a.Decimals, err = readInt(f.value, where+".decimals", 0, maxDecimals); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: unknown key %q in %s (known: symbol, decimals)", ErrConfig, clip(f.key), where)
		}
	}
	if a.Symbol == "" {
		return fmt.Errorf("%w: %s.symbol is required", ErrConfig, where)
	}
	if a.Decimals < 0 {
		return fmt.Errorf("%w: %s.decimals is required", ErrConfig, where)
	}
	if b, ok := c.Assets.Lookup(key); ok && b.Decimals != a.Decimals {
		return fmt.Errorf("%w: %s.decimals is %d, but the built-in %s has %d decimals", ErrConfig, where, a.Decimals, b.Symbol, b.Decimals)
	}
	c.Assets.byKey[key] = a
	return nil
}

// ConfigKeys lists the top-level keys of the policy file, in the order the
// policy reference (docs/rules.md) documents them.
func ConfigKeys() []string {
	return []string{"allowlist", "denylist", "perCounterpartyLimit", "maxOpenPartialPerCounterparty", "totalLimit", "velocity",
		"duplicatePayment", "reviewAbove", "quorum", "reviewNewPayee", "payees", "agents", "tenants", "defaultAsset", "assets", "policy", "historyTemplates", "unreadableHistory",
		"unattributableHistory", "reviewTtlMinutes", "approvalTtlMinutes", "rejectionHoldHours", "maxPendingReviewsPerCaller", "maxAuthorizationSeconds", "reservationMinutes",
		"requireSignedOffers", "sellerKeys"}
}

// readTemplateNames reads historyTemplates (at at): a non-empty list of
// distinct bare template names. Whether each exists is checked when the
// engine starts, against the templates loaded then. ok is false when the
// list has a mistake (reported to ps).
func readTemplateNames(raw json.RawMessage, at Path, ps *problems) (names []string, ok bool) {
	key := at.String()
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || items == nil {
		ps.add(at, fmt.Errorf("%w: %s must be a list of template names", ErrConfig, key))
		return nil, false
	}
	if len(items) == 0 || len(items) > maxHistoryTemplates {
		ps.add(at, fmt.Errorf("%w: %s must name between 1 and %d templates", ErrConfig, key, maxHistoryTemplates))
		return nil, false
	}
	before := ps.count()
	out := make([]string, 0, len(items))
	for i, it := range items {
		iat := at.with(i)
		where := iat.String()
		s, err := readString(it, where)
		if err != nil {
			ps.add(iat, err)
			continue
		}
		if s == "" || len(s) > 64 || !allBytes(s, func(c byte) bool { return isAlpha(c) || isDigit(c) || c == '-' || c == '_' }) {
			ps.add(iat, fmt.Errorf("%w: %s must be a bare template name ([A-Za-z0-9_-]+, at most 64 characters), got %q", ErrConfig, where, clip(s)))
			continue
		}
		if slices.Contains(out, s) {
			ps.add(iat, fmt.Errorf("%w: %s names %q twice", ErrConfig, key, s))
			continue
		}
		out = append(out, s)
	}
	return out, ps.count() == before
}

// readCounterparties reads a list of counterparties at at; ok is false
// when an entry has a mistake (reported to ps).
func readCounterparties(raw json.RawMessage, at Path, ps *problems) (list []Counterparty, ok bool) {
	key := at.String()
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || items == nil {
		ps.add(at, fmt.Errorf("%w: %s must be a list of strings", ErrConfig, key))
		return nil, false
	}
	if len(items) > maxListEntries {
		ps.add(at, fmt.Errorf("%w: %s has %d entries; at most %d are accepted", ErrConfig, key, len(items), maxListEntries))
		return nil, false
	}
	before := ps.count()
	out := make([]Counterparty, 0, len(items))
	for i, it := range items {
		iat := at.with(i)
		where := iat.String()
		s, err := readString(it, where)
		if err != nil {
			ps.add(iat, err)
			continue
		}
		cp, err := ParseCounterparty(s)
		if err != nil {
			ps.add(iat, fmt.Errorf("%w: %s: %w", ErrConfig, where, err))
			continue
		}
		out = append(out, cp)
	}
	return out, ps.count() == before
}

func readString(raw json.RawMessage, where string) (string, error) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", fmt.Errorf("%w: %s must be a string", ErrConfig, where)
	}
	return s, nil
}

// readNumber parses a JSON number literal exactly (apd, no float).
func readNumber(raw json.RawMessage, where string) (*apd.Decimal, error) {
	text := strings.TrimSpace(string(raw))
	if text == "" || !(text[0] == '-' || isDigit(text[0])) {
		return nil, fmt.Errorf("%w: %s must be a number", ErrConfig, where)
	}
	d, _, err := apd.NewFromString(text)
	if err != nil || d.Form != apd.Finite {
		return nil, fmt.Errorf("%w: %s must be a number", ErrConfig, where)
	}
	return d, nil
}

func readInt(raw json.RawMessage, where string, lo, hi int64) (int, error) {
	d, err := readNumber(raw, where)
	if err != nil {
		return 0, err
	}
	var i apd.Decimal
	if _, err := apd.BaseContext.RoundToIntegralExact(&i, d); err != nil || i.Cmp(d) != 0 {
		return 0, fmt.Errorf("%w: %s must be a whole number", ErrConfig, where)
	}
	n, err := i.Int64()
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%w: %s must be between %d and %d", ErrConfig, where, lo, hi)
	}
	return int(n), nil
}

// readWindow reads windowHours: a positive number of hours, whole seconds,
// at most ten years.
func readWindow(raw json.RawMessage, where string) (time.Duration, error) {
	d, err := readNumber(raw, where)
	if err != nil {
		return 0, err
	}
	if d.Sign() <= 0 || d.Cmp(apd.New(maxWindowHours, 0)) > 0 {
		return 0, fmt.Errorf("%w: %s must be more than 0 and at most %d", ErrConfig, where, maxWindowHours)
	}
	var secs, whole apd.Decimal
	if _, err := apd.BaseContext.Mul(&secs, d, apd.New(3600, 0)); err != nil {
		return 0, fmt.Errorf("%w: %s: %w", ErrConfig, where, err)
	}
	if _, err := apd.BaseContext.RoundToIntegralExact(&whole, &secs); err != nil || whole.Cmp(&secs) != 0 {
		return 0, fmt.Errorf("%w: %s must come to a whole number of seconds", ErrConfig, where)
	}
	n, err := whole.Int64()
	if err != nil {
		return 0, fmt.Errorf("%w: %s is out of range", ErrConfig, where)
	}
	return time.Duration(n) * time.Second, nil
}

type member struct {
	key   string
	value json.RawMessage
}

type members []member

func (ms members) get(key string) (json.RawMessage, bool) {
	for _, m := range ms {
		if m.key == key {
			return m.value, true
		}
	}
	return nil, false
}

// objectMembers reads one JSON object, keeping member order and refusing
// duplicate keys and trailing data, so that no key can be silently shadowed.
func objectMembers(data []byte, where string) (members, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("%w: %s must be a JSON object", ErrConfig, where)
	}
	var out members
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: %s is not valid JSON: %w", ErrConfig, where, err)
		}
		key, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("%w: %s: the value of %q is not valid JSON: %w", ErrConfig, where, clip(key), err)
		}
		if seen[key] {
			return nil, fmt.Errorf("%w: %s has the key %q twice", ErrConfig, where, clip(key))
		}
		seen[key] = true
		out = append(out, member{key: key, value: raw})
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("%w: %s is not valid JSON: %w", ErrConfig, where, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: %s has data after the closing brace", ErrConfig, where)
	}
	return out, nil
}

// FormatDefault writes atomic units of the policy's default asset for people.
func (c *Config) FormatDefault(atomic *big.Int) string {
	return FormatAmount(atomic, c.DefaultAsset.Decimals) + " " + c.DefaultAsset.Symbol
}

// limitKeys are the keys an agent's own policy may set; every other key
// applies to every caller.
var limitKeys = []string{"allowlist", "denylist", "perCounterpartyLimit", "maxOpenPartialPerCounterparty",
	"totalLimit", "velocity", "duplicatePayment", "reviewAbove", "quorum", "requireSignedOffers", "sellerKeys", "reviewNewPayee"}

func isLimitKey(k string) bool { return slices.Contains(limitKeys, k) }

// tenantKeys are the keys a tenant's layer may set beyond the limit keys:
// what names a tenant's payees is the tenant's, not an agent's.
var tenantKeys = []string{"payees"}

func isTenantKey(k string) bool { return slices.Contains(tenantKeys, k) }

// isNull: the JSON value null, which turns an optional rule off.
func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// readLimitKey applies one limit key to c. A nested key not given keeps what
// c already has, so an agent's "perCounterpartyLimit": {"amount": "1"} keeps
// the default window. base is where the key's layer is in the file; a
// mistake is reported to ps and leaves c's value as it was.
func (c *Config) readLimitKey(m member, base Path, ps *problems) {
	at := base.with(m.key)
	where := at.String()
	dec := c.DefaultAsset.Decimals
	amount := func(raw json.RawMessage, key string) (*big.Int, error) {
		text, err := readString(raw, key)
		if err != nil {
			return nil, err
		}
		a, err := ParseAmount(text, dec)
		if err != nil {
			return nil, fmt.Errorf("%w: %s in %s: %w", ErrConfig, key, c.DefaultAsset.Symbol, err)
		}
		return a, nil
	}
	switch m.key {
	case "allowlist", "denylist":
		list, ok := readCounterparties(m.value, at, ps)
		if !ok {
			return
		}
		if m.key == "allowlist" {
			c.narrowAllowlist(list)
		} else {
			c.Denylist = unionCounterparties(c.Denylist, list)
		}
	case "perCounterpartyLimit":
		if l := c.readLimit(m.value, at, &c.Limit, amount, ps); l != nil {
			c.Limit = *l
		}
	case "totalLimit":
		if isNull(m.value) {
			c.TotalLimit = nil
			return
		}
		if l := c.readLimit(m.value, at, c.TotalLimit, amount, ps); l != nil {
			c.TotalLimit = l
		}
	case "maxOpenPartialPerCounterparty":
		n, err := readInt(m.value, where, 0, maxOpenPartialCap)
		if err != nil {
			ps.add(at, err)
			return
		}
		c.MaxOpenPartial = n
	case "reviewAbove":
		a, err := amount(m.value, where)
		if err != nil {
			ps.add(at, err)
			return
		}
		c.ReviewAbove = a
	case "quorum":
		if tiers, ok := readQuorum(m.value, at, amount, ps); ok {
			c.Quorum = tiers
		}
	case "requireSignedOffers":
		c.readRequireSignedOffers(m.value, at, ps)
	case "sellerKeys":
		c.readSellerKeys(m.value, at, ps)
	case "reviewNewPayee":
		if isNull(m.value) {
			c.ReviewNewPayee = false
			return
		}
		var b bool
		if err := json.Unmarshal(m.value, &b); err != nil {
			ps.add(at, fmt.Errorf("%w: %s must be true or false", ErrConfig, where))
			return
		}
		c.ReviewNewPayee = b
	case "payees":
		if names, ok := readPayees(m.value, at, ps); ok {
			if names == nil {
				c.Payees = nil
				return
			}
			merged := maps.Clone(c.Payees)
			if merged == nil {
				merged = make(map[string]string, len(names))
			}
			maps.Copy(merged, names)
			c.Payees = merged
		}
	case "velocity":
		if isNull(m.value) {
			c.Velocity = Velocity{}
			return
		}
		inner, err := objectMembers(m.value, where)
		if err != nil {
			ps.add(at, err)
			return
		}
		v := c.Velocity
		for _, im := range inner {
			iat := at.with(im.key)
			var slot **CountLimit
			switch im.key {
			case "perCounterparty":
				slot = &v.PerCounterparty
			case "total":
				slot = &v.Total
			default:
				ps.add(iat, fmt.Errorf("%w: unknown key %q in %s (known: perCounterparty, total)", ErrConfig, clip(im.key), where))
				continue
			}
			if isNull(im.value) {
				*slot = nil
				continue
			}
			if l := readCountLimit(im.value, iat, *slot, ps); l != nil {
				*slot = l
			}
		}
		c.Velocity = v
	case "duplicatePayment":
		if isNull(m.value) {
			c.DuplicateWindow = 0
			return
		}
		inner, err := objectMembers(m.value, where)
		if err != nil {
			ps.add(at, err)
			return
		}
		window := c.DuplicateWindow
		if window == 0 {
			window = defaultDuplicateMinutes * time.Minute
		}
		for _, im := range inner {
			iat := at.with(im.key)
			if im.key != "windowMinutes" {
				ps.add(iat, fmt.Errorf("%w: unknown key %q in %s (known: windowMinutes)", ErrConfig, clip(im.key), where))
				continue
			}
			n, err := readInt(im.value, iat.String(), 1, maxWindowHours*60)
			if err != nil {
				ps.add(iat, err)
				continue
			}
			window = time.Duration(n) * time.Minute
		}
		c.DuplicateWindow = window
	}
}

// readQuorum reads quorum at at: null or a list of {"above": amount,
// "approvals": 2 to 20}, each above once, sorted by above in the result.
// A layer's list replaces the wider layer's; null or [] sets none. ok is
// false when it has a mistake (reported to ps).
func readQuorum(raw json.RawMessage, at Path, amount func(json.RawMessage, string) (*big.Int, error), ps *problems) (tiers []QuorumTier, ok bool) {
	where := at.String()
	if isNull(raw) {
		return nil, true
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || items == nil {
		ps.add(at, fmt.Errorf("%w: %s must be a list of {\"above\": amount, \"approvals\": n}", ErrConfig, where))
		return nil, false
	}
	if len(items) > maxQuorumTiers {
		ps.add(at, fmt.Errorf("%w: %s has %d entries; at most %d are accepted", ErrConfig, where, len(items), maxQuorumTiers))
		return nil, false
	}
	before := ps.count()
	for i, it := range items {
		iat := at.with(i)
		iwhere := iat.String()
		inner, err := objectMembers(it, iwhere)
		if err != nil {
			ps.add(iat, err)
			continue
		}
		t := QuorumTier{Approvals: -1}
		for _, im := range inner {
			kat := iat.with(im.key)
			switch im.key {
			case "above":
				a, err := amount(im.value, kat.String())
				if err != nil {
					ps.add(kat, err)
					continue
				}
				t.Above = a
			case "approvals":
				n, err := readInt(im.value, kat.String(), 2, maxQuorumApprovals)
				if err != nil {
					ps.add(kat, err)
					continue
				}
				t.Approvals = n
			default:
				ps.add(kat, fmt.Errorf("%w: unknown key %q in %s (known: above, approvals)", ErrConfig, clip(im.key), iwhere))
			}
		}
		if t.Above == nil && !inner.has("above") {
			ps.add(iat, fmt.Errorf("%w: %s.above is required", ErrConfig, iwhere))
		}
		if t.Approvals < 0 && !inner.has("approvals") {
			ps.add(iat, fmt.Errorf("%w: %s.approvals is required", ErrConfig, iwhere))
		}
		if t.Above == nil || t.Approvals < 0 {
			continue
		}
		for _, o := range tiers {
			if o.Above.Cmp(t.Above) == 0 {
				ps.add(iat.with("above"), fmt.Errorf("%w: %s.above names an amount an earlier entry of %s names already", ErrConfig, iwhere, where))
			}
		}
		tiers = append(tiers, t)
	}
	if ps.count() > before {
		return nil, false
	}
	slices.SortFunc(tiers, func(a, b QuorumTier) int { return a.Above.Cmp(b.Above) })
	return tiers, true
}

func (ms members) has(key string) bool {
	_, ok := ms.get(key)
	return ok
}

// unionCounterparties is a followed by every entry of b not already in a:
// a narrower layer's denylist adds to the wider one's, never replaces it.
func unionCounterparties(a, b []Counterparty) []Counterparty {
	out := slices.Clone(a)
	for _, e := range b {
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out
}

// narrowAllowlist applies one layer's allowlist. An empty list adds no
// restriction. The first non-empty list turns the allowlist on; every later
// one keeps only the counterparties on both, so a narrower layer can narrow
// the allowlist but never widen it. Two lists with nothing in common leave
// the allowlist on and empty: every counterparty goes to review.
func (c *Config) narrowAllowlist(list []Counterparty) {
	if len(list) == 0 {
		return
	}
	if !c.Allowlisting {
		c.Allowlist, c.Allowlisting = unionCounterparties(nil, list), true
		return
	}
	var kept []Counterparty
	for _, e := range c.Allowlist {
		if slices.Contains(list, e) {
			kept = append(kept, e)
		}
	}
	c.Allowlist = kept
}

// readLimit reads {amount, windowHours} at at over base (nil: nothing
// yet, so the amount is required and the window defaults to 24 hours). It
// never changes *base, which the default policy may share with an
// agent's. nil when it has a mistake (reported to ps).
func (c *Config) readLimit(raw json.RawMessage, at Path, base *Limit, amount func(json.RawMessage, string) (*big.Int, error), ps *problems) *Limit {
	where := at.String()
	inner, err := objectMembers(raw, where)
	if err != nil {
		ps.add(at, err)
		return nil
	}
	l := Limit{Window: defaultWindowHours * time.Hour}
	if base != nil {
		l = *base
	}
	before := ps.count()
	for _, im := range inner {
		iat := at.with(im.key)
		switch im.key {
		case "amount":
			a, err := amount(im.value, iat.String())
			if err != nil {
				ps.add(iat, err)
				continue
			}
			l.Amount = a
		case "windowHours":
			w, err := readWindow(im.value, iat.String())
			if err != nil {
				ps.add(iat, err)
				continue
			}
			l.Window = w
		default:
			ps.add(iat, fmt.Errorf("%w: unknown key %q in %s (known: amount, windowHours)", ErrConfig, clip(im.key), where))
		}
	}
	if ps.count() > before {
		return nil
	}
	if l.Amount == nil {
		ps.add(at, fmt.Errorf("%w: %s.amount is required", ErrConfig, where))
		return nil
	}
	return &l
}

// readCountLimit reads {count, windowMinutes} at at over base (nil: the
// count is required and the window defaults to 60 minutes). nil when it
// has a mistake (reported to ps).
func readCountLimit(raw json.RawMessage, at Path, base *CountLimit, ps *problems) *CountLimit {
	where := at.String()
	inner, err := objectMembers(raw, where)
	if err != nil {
		ps.add(at, err)
		return nil
	}
	l := CountLimit{Count: -1, Window: defaultVelocityMinutes * time.Minute}
	if base != nil {
		l = *base
	}
	before := ps.count()
	for _, im := range inner {
		iat := at.with(im.key)
		switch im.key {
		case "count":
			n, err := readInt(im.value, iat.String(), 1, maxCount)
			if err != nil {
				ps.add(iat, err)
				continue
			}
			l.Count = n
		case "windowMinutes":
			n, err := readInt(im.value, iat.String(), 1, maxWindowHours*60)
			if err != nil {
				ps.add(iat, err)
				continue
			}
			l.Window = time.Duration(n) * time.Minute
		default:
			ps.add(iat, fmt.Errorf("%w: unknown key %q in %s (known: count, windowMinutes)", ErrConfig, clip(im.key), where))
		}
	}
	if ps.count() > before {
		return nil
	}
	if l.Count < 0 {
		ps.add(at, fmt.Errorf("%w: %s.count is required", ErrConfig, where))
		return nil
	}
	return &l
}

// readTenants reads tenants: {"<tenant>": {limit keys, "agents": {…}}}.
// A tenant's policy is the file's with the tenant's layer composed over it.
// Within a tenant, a caller with an entry under the top-level agents, under
// the tenant's own agents, or both, gets the tenant's policy with the
// top-level agent layer and then the tenant's agent layer composed over it.
func (c *Config) readTenants(raw json.RawMessage, agentLayers []layer, ps *problems) {
	entries, err := objectMembers(raw, "tenants")
	if err != nil {
		ps.add(Path{"tenants"}, err)
		return
	}
	c.Tenants = make(map[string]*Config, len(entries))
	for _, e := range entries {
		at := Path{"tenants", Name(e.key)}
		if e.key == "" || len(e.key) > 64 || !allBytes(e.key, func(b byte) bool { return isAlpha(b) || isDigit(b) || b == '-' || b == '_' }) {
			ps.add(at, fmt.Errorf("%w: tenants: %q is not a tenant name (a bare slug [A-Za-z0-9_-], at most 64 characters)", ErrConfig, clip(e.key)))
			continue
		}
		where := at.String()
		keys, err := objectMembers(e.value, where)
		if err != nil {
			ps.add(at, err)
			continue
		}
		tl := layer{name: "tenant " + e.key, at: at}
		var own []layer
		for _, m := range keys {
			kat := at.with(m.key)
			if m.key == "agents" {
				own = readAgentLayers(m.value, kat, "tenant "+e.key+" ", ps)
				continue
			}
			if !isLimitKey(m.key) && !isTenantKey(m.key) {
				may := strings.Join(append(slices.Clone(limitKeys), tenantKeys...), ", ")
				if slices.Contains(ConfigKeys(), m.key) {
					ps.add(kat, fmt.Errorf("%w: %s applies to every tenant and cannot be set per tenant (a tenant may set: %s, agents)", ErrConfig, kat, may))
				} else {
					ps.add(kat, fmt.Errorf("%w: unknown key %q in %s (known: %s, agents)", ErrConfig, clip(m.key), where, may))
				}
				continue
			}
			tl.keys = append(tl.keys, m)
		}
		t := c.compose(tl, ps)
		// Every caller with an agent layer at either level, in a stable order.
		byAgent := map[string][2]*layer{}
		var ids []string
		for i := range agentLayers {
			a := &agentLayers[i]
			ids = append(ids, a.agent)
			byAgent[a.agent] = [2]*layer{a, nil}
		}
		for i := range own {
			a := &own[i]
			pair, ok := byAgent[a.agent]
			if !ok {
				ids = append(ids, a.agent)
			}
			pair[1] = a
			byAgent[a.agent] = pair
		}
		if len(ids) > maxAgents {
			ps.add(at, fmt.Errorf("%w: %s has %d callers with their own policy; at most %d are accepted", ErrConfig, where, len(ids), maxAgents))
			continue
		}
		if len(ids) > 0 {
			t.Agents = make(map[string]*Config, len(ids))
		}
		for _, id := range ids {
			ac := t
			for _, l := range byAgent[id] {
				if l == nil {
					continue
				}
				ac = ac.compose(*l, ps)
			}
			t.Agents[id] = ac
		}
		c.Tenants[e.key] = t
	}
}

// readAgentLayers reads an agents object, {"<caller id>": {limit keys}},
// at at (agents or tenants["acme"].agents); naming prefixes each layer's
// name ("" or "tenant acme "). An entry with a mistake (reported to ps)
// is left out.
func readAgentLayers(raw json.RawMessage, at Path, naming string, ps *problems) []layer {
	where := at.String()
	entries, err := objectMembers(raw, where)
	if err != nil {
		ps.add(at, err)
		return nil
	}
	if len(entries) > maxAgents {
		ps.add(at, fmt.Errorf("%w: %s has %d entries; at most %d are accepted", ErrConfig, where, len(entries), maxAgents))
		return nil
	}
	out := make([]layer, 0, len(entries))
	for _, e := range entries {
		eat := at.with(Name(e.key))
		if !ValidAgentID(e.key) {
			ps.add(eat, fmt.Errorf("%w: %s: %q is not a caller id (1 to %d bytes of UTF-8 without control characters)", ErrConfig, where, clip(e.key), maxAgentIDBytes))
			continue
		}
		keys, err := objectMembers(e.value, eat.String())
		if err != nil {
			ps.add(eat, err)
			continue
		}
		var limits members
		for _, m := range keys {
			kat := eat.with(m.key)
			if isTenantKey(m.key) {
				ps.add(kat, fmt.Errorf("%w: %s names payees for every caller of its tenant: set it at the top of the file or in a tenant's layer, not per agent", ErrConfig, kat))
				continue
			}
			if !isLimitKey(m.key) {
				if slices.Contains(ConfigKeys(), m.key) {
					ps.add(kat, fmt.Errorf("%w: %s applies to every caller and cannot be set per agent (an agent may set: %s)", ErrConfig, kat, strings.Join(limitKeys, ", ")))
				} else {
					ps.add(kat, fmt.Errorf("%w: unknown key %q in %s (known: %s)", ErrConfig, clip(m.key), eat, strings.Join(limitKeys, ", ")))
				}
				continue
			}
			limits = append(limits, m)
		}
		out = append(out, layer{name: naming + "agent " + e.key, at: eat, agent: e.key, keys: limits})
	}
	return out
}

// ValidAgentID says whether s can be a caller id: 1 to 256 bytes of UTF-8
// without control characters (C0, DEL, C1).
func ValidAgentID(s string) bool {
	return s != "" && len(s) <= maxAgentIDBytes && utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl)
}

// QuestionTemplate is the template a question that names none is judged
// under: DefaultTemplate when the policy reads history under it, else the
// first template it does.
func (c *Config) QuestionTemplate() string {
	if c == nil || len(c.HistoryTemplates) == 0 || slices.Contains(c.HistoryTemplates, DefaultTemplate) {
		return DefaultTemplate
	}
	return c.HistoryTemplates[0]
}
