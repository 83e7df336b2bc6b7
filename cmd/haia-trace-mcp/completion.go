package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
)

// commandInfo is one top-level command: its subcommands and the line the
// top-level help shows for it.
type commandInfo struct {
	name  string
	subs  []string
	usage string
}

// commands lists every top-level command. The top-level help, the
// completion scripts and the suggestion for a mistyped command read it;
// the flags each takes are read from the command's own flag set (its
// --help), so completion offers exactly the flags the command accepts.
// TestCommandsTable keeps it and run's dispatch in step.
var commands = []commandInfo{
	{name: "build", usage: "build RUN_FILE [--template NAME|PATH] [--templates-dir DIR]"},
	{name: "policy", subs: []string{"check", "eval"}, usage: "policy check FILE | policy eval FILE --input INPUT.json"},
	{name: "verify", usage: "verify CHAIN [--keyring K] [--checkpoint C] [--identity M] [--follow] [--store URL]"},
	{name: "signer", usage: "signer --key-file K --listen unix:PATH | --payer-key K --listen unix:PATH"},
	{name: "payer", subs: []string{"address"}, usage: "payer address --payer-key K | --payer-signer unix:PATH"},
	{name: "authorization", subs: []string{"show"}, usage: "authorization show NONCE|RECEIPT_ID [--dir .trace] [--json]"},
	{name: "review", subs: []string{"list", "show", "approve", "reject", "watch", "archive"},
		usage: "review list|show|approve|reject|watch|archive [<review_id>] [--dir .trace] [--all] [--note \"…\"] [--reviewer-key K] [--json]"},
	{name: "init", usage: "init [DIR]                       a Trace root from nothing: layout, keys, a reviewer, an example policy"},
	{name: "reviewer", subs: []string{"init", "passkey"}, usage: "reviewer init|passkey add|remove --id ID [--reviewers F] [--console-url URL]"},
	{name: "audit", usage: "audit [--dir .trace] [--reviewers F] [--keyring K]"},
	{name: "status", usage: "status [--dir .trace] [--store URL] [--json]   the state at a glance: runs, payments, reviews, chains, policy"},
	{name: "store", subs: []string{"migrate", "import", "export"}, usage: "store migrate|import|export --store postgres://… [--dir .trace]"},
	{name: "chain", subs: []string{"list", "export", "checkpoint"}, usage: "chain list|export ID|checkpoint ID [--dir .trace]"},
	{name: "proxy", usage: "proxy --guard-map FILE [--dir .trace] [flags] -- UPSTREAM_COMMAND [ARGS…] | --upstream-url URL"},
	{name: "healthcheck", usage: "healthcheck [--url http://127.0.0.1:3000/healthz] [--timeout 3s]"},
	{name: "demo", usage: "demo [--keep DIR]                 the whole story on a simulated Trace root"},
	{name: "completion", subs: []string{"bash", "zsh", "fish"}, usage: "completion bash|zsh|fish        a shell completion script"},
	{name: "version", usage: "version | --version"},
	{name: "help", usage: "help | --help                    this text and the server's flags"},
}

// topUsage is the top-level usage: serving, then every command.
func topUsage() string {
	var b strings.Builder
	b.WriteString("usage:\n  haia-trace-mcp [--dir .trace] [flags]        serve MCP (stdio by default, --http for Streamable HTTP)\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  haia-trace-mcp %s\n", c.usage)
	}
	b.WriteString("\nEvery command takes --help for its flags.\n")
	return b.String()
}

// commandNames lists the top-level command names.
func commandNames() []string {
	out := make([]string, len(commands))
	for i, c := range commands {
		out[i] = c.name
	}
	return out
}

// suggestCommand is the known command nearest to a mistyped one, or "".
func suggestCommand(name string) string {
	best, bestD := "", 3 // at most two edits away, or a prefix
	for _, c := range commands {
		if strings.HasPrefix(c.name, name) && len(name) >= 2 {
			return c.name
		}
		if d := editDistance(name, c.name); d < bestD {
			best, bestD = c.name, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// flagsOf lists the flags (as --name) the command at path takes, read from
// its own --help: the flag set is the one source.
func flagsOf(path []string) []string {
	var out bytes.Buffer
	run(context.Background(), append(slices.Clone(path), "--help"), strings.NewReader(""), &out, io.Discard)
	var flags []string
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, "  -")
		if !ok || strings.HasPrefix(rest, "-") {
			continue
		}
		name, _, _ := strings.Cut(rest, " ")
		flags = append(flags, "--"+name)
	}
	return flags
}

// completionWords maps "" to the top-level words (commands and the
// server's flags) and each command to its subcommands and every flag any
// of its subcommands takes.
func completionWords() map[string][]string {
	words := map[string][]string{"": append(commandNames(), flagsOf(nil)...)}
	words[""] = append(words[""], "--help", "--version")
	for _, c := range commands {
		if c.name == "help" || c.name == "version" {
			continue
		}
		seen := map[string]bool{}
		var w []string
		add := func(s string) {
			if !seen[s] {
				seen[s] = true
				w = append(w, s)
			}
		}
		for _, s := range c.subs {
			add(s)
		}
		if len(c.subs) == 0 || c.name == "completion" {
			for _, f := range flagsOf([]string{c.name}) {
				add(f)
			}
		} else {
			for _, s := range c.subs {
				for _, f := range flagsOf([]string{c.name, s}) {
					add(f)
				}
			}
		}
		add("--help")
		words[c.name] = w
	}
	return words
}

func runCompletion(args []string, stdout, stderr io.Writer) int {
	c := newCommand("completion", "usage:\n  haia-trace-mcp completion bash|zsh|fish\n\nPrints a shell completion script, e.g. source <(haia-trace-mcp completion bash).\n", stdout, stderr)
	pos, code, ok := c.parse(args)
	if !ok {
		return code
	}
	if code, ok := c.wantArgs(pos, 1, 1, "one shell: bash, zsh or fish"); !ok {
		return code
	}
	switch pos[0] {
	case "bash":
		fmt.Fprint(stdout, bashCompletion(completionWords()))
	case "zsh":
		fmt.Fprint(stdout, "#compdef haia-trace-mcp\nautoload -U +X bashcompinit && bashcompinit\n"+bashCompletion(completionWords()))
	case "fish":
		fmt.Fprint(stdout, fishCompletion(completionWords()))
	default:
		return c.failf("unknown shell %q; want bash, zsh or fish", pos[0])
	}
	return exitOK
}

func sortedKeys(words map[string][]string) []string {
	keys := make([]string, 0, len(words))
	for k := range words {
		if k != "" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

func bashCompletion(words map[string][]string) string {
	var b strings.Builder
	b.WriteString("# bash completion for haia-trace-mcp\n_haia_trace_mcp() {\n  local cur=\"${COMP_WORDS[COMP_CWORD]}\" cmd=\"${COMP_WORDS[1]}\" words\n  if [ \"$COMP_CWORD\" -eq 1 ]; then\n")
	fmt.Fprintf(&b, "    words=%q\n", strings.Join(words[""], " "))
	b.WriteString("  else\n    case \"$cmd\" in\n")
	for _, k := range sortedKeys(words) {
		fmt.Fprintf(&b, "      %s) words=%q ;;\n", k, strings.Join(words[k], " "))
	}
	b.WriteString("      *) words=\"--help\" ;;\n    esac\n  fi\n  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n}\ncomplete -o default -F _haia_trace_mcp haia-trace-mcp\n")
	return b.String()
}

func fishCompletion(words map[string][]string) string {
	var b strings.Builder
	b.WriteString("# fish completion for haia-trace-mcp\n")
	for _, w := range words[""] {
		if strings.HasPrefix(w, "--") {
			fmt.Fprintf(&b, "complete -c haia-trace-mcp -n '__fish_use_subcommand' -l %s\n", strings.TrimPrefix(w, "--"))
		} else {
			fmt.Fprintf(&b, "complete -c haia-trace-mcp -n '__fish_use_subcommand' -a %s\n", w)
		}
	}
	for _, k := range sortedKeys(words) {
		for _, w := range words[k] {
			if strings.HasPrefix(w, "--") {
				fmt.Fprintf(&b, "complete -c haia-trace-mcp -n '__fish_seen_subcommand_from %s' -l %s\n", k, strings.TrimPrefix(w, "--"))
			} else {
				fmt.Fprintf(&b, "complete -c haia-trace-mcp -n '__fish_seen_subcommand_from %s' -a %s\n", k, w)
			}
		}
	}
	return b.String()
}
