package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// completionWords are the commands, their subcommands and flags, for the
// completion scripts. TestCompletionKnowsEveryCommand keeps them true.
var completionWords = map[string][]string{
	"":              {"build", "policy", "verify", "signer", "review", "reviewer", "audit", "init", "chain", "store", "healthcheck", "proxy", "demo", "version", "completion", "help", "payer", "authorization"},
	"review":        {"list", "show", "approve", "reject", "watch", "archive", "--older-than", "--dir", "--json", "--all", "--note", "--by", "--reviewer-key", "--reviewers", "--guard-config", "--lock-wait", "--interval", "--tenant"},
	"reviewer":      {"init", "--id", "--key-file", "--reviewers"},
	"chain":         {"list", "export", "checkpoint", "--dir", "--all", "--out", "--key-file", "--signer", "--store"},
	"store":         {"migrate", "import", "export", "--store", "--dir"},
	"policy":        {"check", "eval", "--input"},
	"verify":        {"--keyring", "--checkpoint", "--identity", "--follow"},
	"audit":         {"--dir", "--reviewers", "--keyring", "--guard-config"},
	"init":          {"--config", "--key-file", "--reviewer-id", "--reviewer-key", "--reviewers"},
	"build":         {"--template", "--templates-dir"},
	"signer":        {"--key-file", "--listen", "--payer-key", "--payer-key-password-file"},
	"payer":         {"address", "--payer-key", "--payer-key-password-file", "--payer-signer"},
	"authorization": {"show", "--dir", "--json", "--keyring", "--reviewers", "--store"},
	"healthcheck":   {"--url", "--timeout"},
	"demo":          {"--keep"},
	"proxy":         {"--guard-map", "--upstream-url", "--upstream-token-file", "--upstream-restart", "--upstream-timeout", "--dir", "--guard-config", "--agent-id", "--http", "--store"},
	"completion":    {"bash", "zsh", "fish"},
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
		fmt.Fprint(stdout, bashCompletion())
	case "zsh":
		fmt.Fprint(stdout, "#compdef haia-trace-mcp\nautoload -U +X bashcompinit && bashcompinit\n"+bashCompletion())
	case "fish":
		fmt.Fprint(stdout, fishCompletion())
	default:
		return c.failf("unknown shell %q; want bash, zsh or fish", pos[0])
	}
	return exitOK
}

func sortedKeys() []string {
	keys := make([]string, 0, len(completionWords))
	for k := range completionWords {
		if k != "" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

func bashCompletion() string {
	var b strings.Builder
	b.WriteString("# bash completion for haia-trace-mcp\n_haia_trace_mcp() {\n  local cur=\"${COMP_WORDS[COMP_CWORD]}\" cmd=\"${COMP_WORDS[1]}\" words\n  if [ \"$COMP_CWORD\" -eq 1 ]; then\n")
	fmt.Fprintf(&b, "    words=%q\n", strings.Join(completionWords[""], " ")+" --dir --http --guard-config --key-file --reviewers --agent-id --help --version")
	b.WriteString("  else\n    case \"$cmd\" in\n")
	for _, k := range sortedKeys() {
		fmt.Fprintf(&b, "      %s) words=%q ;;\n", k, strings.Join(completionWords[k], " ")+" --help")
	}
	b.WriteString("      *) words=\"--help\" ;;\n    esac\n  fi\n  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n}\ncomplete -o default -F _haia_trace_mcp haia-trace-mcp\n")
	return b.String()
}

func fishCompletion() string {
	var b strings.Builder
	b.WriteString("# fish completion for haia-trace-mcp\n")
	for _, w := range completionWords[""] {
		fmt.Fprintf(&b, "complete -c haia-trace-mcp -n '__fish_use_subcommand' -a %s\n", w)
	}
	for _, k := range sortedKeys() {
		for _, w := range completionWords[k] {
			if strings.HasPrefix(w, "--") {
				fmt.Fprintf(&b, "complete -c haia-trace-mcp -n '__fish_seen_subcommand_from %s' -l %s\n", k, strings.TrimPrefix(w, "--"))
			} else {
				fmt.Fprintf(&b, "complete -c haia-trace-mcp -n '__fish_seen_subcommand_from %s' -a %s\n", k, w)
			}
		}
	}
	return b.String()
}
