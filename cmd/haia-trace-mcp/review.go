package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// Exit codes of `review` beyond exitOK, exitFail and exitUsage.
const (
	reviewExitUnknown = 3 // no review with that id
	reviewExitDecided = 4 // the review was already decided
	reviewExitLock    = 5 // the review log's lock was not obtained in time
)

const reviewUsage = `usage:
  haia-trace-mcp review list [--dir .trace] [--all] [--json]
  haia-trace-mcp review show <review_id> [--dir .trace] [--json]
  haia-trace-mcp review approve <review_id> [--note "…"] [--by ID] [--dir .trace] [--json]
  haia-trace-mcp review reject  <review_id> [--note "…"] [--by ID] [--dir .trace] [--json]
  haia-trace-mcp review watch [--dir .trace] [--json] [--interval 1s]

exit codes: 0 done, 1 error, 2 usage, 3 unknown review id, 4 already decided,
5 review log lock not obtained
`

// runReview is the human's side of the guard: list the reviews the guard
// opened and approve or reject them. No MCP tool can do this.
func runReview(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, reviewUsage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	verb, rest := args[0], args[1:]
	fs := flag.NewFlagSet("review "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dir := fs.String("dir", ".trace", "the Trace root")
	asJSON := fs.Bool("json", false, "print JSON")
	lockWait := fs.Duration("lock-wait", 5*time.Second, "how long to wait for the review log's lock")
	var all *bool
	var note, by *string
	var signing signingFlags
	switch verb {
	case "watch":
		return runReviewWatch(ctx, rest, stdout, stderr)
	case "list":
		all = fs.Bool("all", false, "include decided reviews")
	case "show":
	case "approve", "reject":
		note = fs.String("note", "", "why (kept in the log)")
		by = fs.String("by", "", "who decides (default: the OS user name)")
		signing.register(fs)
	default:
		fmt.Fprintf(stderr, "haia-trace-mcp review: unknown subcommand %q\n\n%s", verb, reviewUsage)
		return exitUsage
	}
	pos, err := reviewParseArgs(fs, rest)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp review %s: %v\n\n%s", verb, err, reviewUsage)
		return exitUsage
	}
	wantArgs := 1
	if verb == "list" {
		wantArgs = 0
	}
	if len(pos) != wantArgs {
		fmt.Fprintf(stderr, "haia-trace-mcp review %s: expected %d argument(s), got %d\n\n%s", verb, wantArgs, len(pos), reviewUsage)
		return exitUsage
	}

	root, err := confined.OpenRoot(*dir)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp review: the Trace root: %v\n", err)
		return exitFail
	}
	defer root.Close()
	log := reviewlog.Open(root, reviewlog.Options{LockWait: *lockWait})

	switch verb {
	case "list":
		reviews, err := log.List(ctx, *all)
		if err != nil {
			return reviewFailed(stderr, verb, err)
		}
		if *asJSON {
			return reviewWriteJSON(stdout, stderr, map[string]any{"reviews": reviews})
		}
		reviewPrintList(stdout, reviews, *all)
		return exitOK
	case "show":
		r, err := log.Get(ctx, pos[0])
		if err != nil {
			return reviewFailed(stderr, verb, err)
		}
		if *asJSON {
			return reviewWriteJSON(stdout, stderr, r)
		}
		reviewPrintOne(stdout, r)
		return exitOK
	}

	who := *by
	if who == "" {
		if who = reviewUserName(); who == "" {
			fmt.Fprintf(stderr, "haia-trace-mcp review %s: cannot tell who you are from the OS; pass --by\n", verb)
			return exitUsage
		}
	}
	status := reviewlog.Approved
	if verb == "reject" {
		status = reviewlog.Rejected
	}
	// The decision is signed into the decision chain inside the log's lock;
	// if it cannot be signed, it is not recorded at all (fail closed).
	signer, paramsKey, err := signing.open(slog.New(slog.NewTextHandler(stderr, nil)))
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp review %s: %v\n", verb, err)
		return exitFail
	}
	chains := &reviewlog.Chains{Signer: signer, Tenant: signing.tenant}
	r, err := engine.Decider{Log: log, Chains: chains, ParamsKey: paramsKey}.Decide(ctx, pos[0], status, *note, who)
	if err != nil {
		return reviewFailed(stderr, verb, err)
	}
	if *asJSON {
		return reviewWriteJSON(stdout, stderr, r)
	}
	fmt.Fprintf(stdout, "review %s %s by %s at %s\n", r.ID, r.Status, r.DecidedBy, r.DecidedAt)
	return exitOK
}

// reviewParseArgs lets flags come after the positional arguments
// ("approve ID --note x"), which the flag package alone stops at.
func reviewParseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// reviewFailed prints err and maps it to the documented exit code.
func reviewFailed(stderr io.Writer, verb string, err error) int {
	fmt.Fprintf(stderr, "haia-trace-mcp review %s: %v\n", verb, err)
	switch {
	case errors.Is(err, reviewlog.ErrUnknownReview):
		return reviewExitUnknown
	case errors.Is(err, reviewlog.ErrAlreadyDecided):
		return reviewExitDecided
	case errors.Is(err, reviewlog.ErrLockTimeout):
		return reviewExitLock
	case errors.Is(err, reviewlog.ErrBadID), errors.Is(err, reviewlog.ErrBadInput):
		return exitUsage
	}
	return exitFail
}

func reviewUserName() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return os.Getenv("USER")
}

func reviewWriteJSON(stdout, stderr io.Writer, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp review: write: %v\n", err)
		return exitFail
	}
	return exitOK
}

func reviewPrintList(w io.Writer, reviews []reviewlog.Review, all bool) {
	if len(reviews) == 0 {
		if all {
			fmt.Fprintln(w, "no reviews")
		} else {
			fmt.Fprintln(w, "no pending reviews")
		}
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REVIEW ID\tSTATUS\tCREATED\tCOUNTERPARTY\tAMOUNT\tASSET\tRULES")
	for _, r := range reviews {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Status, r.CreatedAt, reviewOneLine(r.Counterparty), reviewOneLine(r.Amount), reviewOneLine(r.Asset), strings.Join(reviewRules(r), ","))
	}
	tw.Flush()
}

func reviewPrintOne(w io.Writer, r reviewlog.Review) {
	fmt.Fprintf(w, "review       %s\nstatus       %s\ncreated      %s\ncounterparty %s\namount       %s\nasset        %s\n",
		r.ID, r.Status, r.CreatedAt, reviewOneLine(r.Counterparty), reviewOneLine(r.Amount), reviewOneLine(r.Asset))
	if r.Template != "" {
		fmt.Fprintf(w, "template     %s\n", reviewOneLine(r.Template))
	}
	if r.Status != reviewlog.Pending {
		fmt.Fprintf(w, "decided      %s by %s\n", r.DecidedAt, reviewOneLine(r.DecidedBy))
		if r.Note != "" {
			fmt.Fprintf(w, "note         %s\n", reviewOneLine(r.Note))
		}
	}
	fmt.Fprintln(w, "reasons")
	for _, reason := range r.Reasons {
		fmt.Fprintf(w, "  %s: %s\n", reason.Rule, reviewOneLine(reason.Detail))
		for _, e := range reason.Evidence {
			fmt.Fprintf(w, "    run %s, operation %s\n", reviewOneLine(e.RunID), reviewOneLine(e.OperationID))
		}
	}
}

func reviewRules(r reviewlog.Review) []string {
	var out []string
	for _, reason := range r.Reasons {
		if reason.Rule != "history" {
			out = append(out, reason.Rule)
		}
	}
	return out
}

// reviewOneLine keeps text that came from an agent from breaking (or forging)
// lines of the terminal output.
func reviewOneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u2028' || r == '\u2029' {
			return '�'
		}
		return r
	}, s)
}
