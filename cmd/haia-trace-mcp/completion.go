package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
)

// completionNames are the command words the scripts register for: the name
// on PATH and the ./haia-trace-mcp the README builds and runs. bash and zsh
// look a compspec up by the word as typed, so ./haia-trace-mcp needs its own
// (bash falls back to the last path element for other paths; fish matches
// the basename itself).
const completionNames = "haia-trace-mcp ./haia-trace-mcp"

// completionEntry is what the completion scripts offer after a command
// path ("" for the top level, "review approve"): its subcommands, the
// values of its argument, its flags.
type completionEntry struct {
	path  string
	words []string
}

// completionEntries lists, for every command in the table, the words the
// scripts offer after it. The flags are read from the command's own flag
// set, so a script offers exactly the flags a command accepts.
func completionEntries(root *cmdSpec) []completionEntry {
	var out []completionEntry
	var walk func(c *cmdSpec, path []string)
	walk = func(c *cmdSpec, path []string) {
		words := append(c.subNames(), c.argWords...)
		if c.define != nil {
			fs, _ := c.flagSet(strings.Join(path, " "))
			fs.VisitAll(func(f *flag.Flag) { words = append(words, "--"+f.Name) })
		}
		words = append(words, "--help")
		if len(path) == 0 {
			words = append(words, "--version")
		}
		out = append(out, completionEntry{path: strings.Join(path, " "), words: words})
		for _, s := range c.subs {
			walk(s, append(append([]string{}, path...), s.name))
		}
	}
	walk(root, nil)
	return out
}

// defineCompletion is `completion bash|zsh|fish`.
func defineCompletion(*flag.FlagSet) runFunc {
	return func(_ context.Context, env *cmdEnv, pos []string) error {
		entries := completionEntries(commandTable())
		switch pos[0] {
		case "bash":
			fmt.Fprint(env.stdout, bashCompletion(entries))
		case "zsh":
			fmt.Fprint(env.stdout, "#compdef "+completionNames+"\nautoload -U +X bashcompinit && bashcompinit\n"+bashCompletion(entries))
		case "fish":
			fmt.Fprint(env.stdout, fishCompletion(entries))
		default:
			return usageErrorf("unknown shell %q; want bash, zsh or fish", pos[0])
		}
		return nil
	}
}

// bashCompletion is the bash (and, through bashcompinit, zsh) script: it
// finds the command path among the words typed so far (flags, their values
// and arguments skipped), then offers that command's words.
func bashCompletion(entries []completionEntry) string {
	var known []string
	for _, e := range entries {
		if e.path != "" {
			known = append(known, e.path)
		}
	}
	var b strings.Builder
	b.WriteString("# bash completion for haia-trace-mcp\n_haia_trace_mcp() {\n")
	b.WriteString("  local cur=\"${COMP_WORDS[COMP_CWORD]}\" path=\"\" cand w i words\n")
	fmt.Fprintf(&b, "  local known=%q\n", "|"+strings.Join(known, "|")+"|")
	b.WriteString("  for ((i = 1; i < COMP_CWORD; i++)); do\n")
	b.WriteString("    w=\"${COMP_WORDS[i]}\"\n")
	b.WriteString("    case \"$w\" in -*) continue ;; esac\n")
	b.WriteString("    cand=\"${path:+$path }$w\"\n")
	b.WriteString("    [[ \"$known\" == *\"|$cand|\"* ]] || continue\n")
	b.WriteString("    path=\"$cand\"\n")
	b.WriteString("  done\n  case \"$path\" in\n")
	for _, e := range entries {
		fmt.Fprintf(&b, "    %q) words=%q ;;\n", e.path, strings.Join(e.words, " "))
	}
	b.WriteString("    *) words=\"--help\" ;;\n  esac\n")
	b.WriteString("  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n}\n")
	b.WriteString("complete -o default -F _haia_trace_mcp " + completionNames + "\n")
	return b.String()
}

// fishCompletion is the fish script: a function finds the command path
// among the words typed so far; each word is offered where the path is
// its command's.
func fishCompletion(entries []completionEntry) string {
	var b strings.Builder
	b.WriteString("# fish completion for haia-trace-mcp\nfunction __haia_trace_mcp_path\n    set -l path ''\n")
	b.WriteString("    for w in (commandline -opc)[2..-1]\n")
	b.WriteString("        string match -q -- '-*' $w; and continue\n")
	b.WriteString("        set -l cand (string trim -- \"$path $w\")\n")
	b.WriteString("        contains -- $cand")
	for _, e := range entries {
		if e.path != "" {
			fmt.Fprintf(&b, " '%s'", e.path)
		}
	}
	b.WriteString("; or continue\n        set path $cand\n    end\n    echo $path\nend\n")
	for _, e := range entries {
		cond := fmt.Sprintf("test (__haia_trace_mcp_path) = '%s'", e.path)
		for _, w := range e.words {
			if name, ok := strings.CutPrefix(w, "--"); ok {
				fmt.Fprintf(&b, "complete -c haia-trace-mcp -n \"%s\" -l %s\n", cond, name)
			} else {
				fmt.Fprintf(&b, "complete -c haia-trace-mcp -n \"%s\" -a %s\n", cond, w)
			}
		}
	}
	return b.String()
}
