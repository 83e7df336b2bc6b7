package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

const templateDetails = `show prints what a recorder must write for a template: its stages in order,
the events that close each (with the role it must be observed by), the
payload fields the guard reads at each stage, the fields every line needs,
how the guard judges an operation of it, and an example run of one
operation that builds full (it is assembled against the template before it
is printed, and the completeness printed is the assembler's).

NAME is a template the server would use: the Trace root's templates/ (or
--templates-dir) first, then the bundled ones; or a PATH to a template file.
exit codes: 0 shown, 1 the template cannot be read, 2 usage
`

// defineTemplateShow is `template show NAME|PATH`.
func defineTemplateShow(fs *flag.FlagSet) runFunc {
	dir := dirFlag(fs)
	tdir := new(string)
	templatesDirFlagVar(fs, tdir)
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, env *cmdEnv, pos []string) error {
		dirSet := false
		env.fs.Visit(func(f *flag.Flag) { dirSet = dirSet || f.Name == "dir" })
		t, err := resolveTemplate(pos[0], *dir, dirSet, *tdir)
		if err != nil {
			return err
		}
		g := guard.GuideFor(t)
		if *asJSON {
			return exitCode(reviewWriteJSON(env.stdout, env.stderr, g))
		}
		printTemplateGuide(env.stdout, g, pos[0])
		return nil
	}
}

// resolveTemplate finds a template as the server started on dir would:
// the operator's templates (--templates-dir, else dir/templates/), then the
// bundled ones; a name that is no bare slug is a file's path. A --dir that
// is not there is an error when given, and means only the bundled
// templates when it is the default.
func resolveTemplate(name, dir string, dirSet bool, templatesDir string) (*receipt.Template, error) {
	if !receipt.IsSlug(name) {
		return receipt.LoadTemplateFile(name)
	}
	if templatesDir != "" {
		r, err := templatesDirResolver(templatesDir)
		if err != nil {
			return nil, err
		}
		return r.Resolve(name)
	}
	root, err := app.OpenRoot(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist) && !dirSet:
		return receipt.Resolver{}.Resolve(name)
	case err != nil:
		return nil, fmt.Errorf("--dir: %w", err)
	}
	defer root.Close()
	set, err := root.Templates("", slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	return set.Resolve(name)
}

func printTemplateGuide(w io.Writer, g guard.TemplateGuide, ref string) {
	s := termsafe.String
	fmt.Fprintf(w, "template %s, version %s (%s)\n", s(g.Template), jsjson.FormatNumber(g.Version), s(g.Source))
	fmt.Fprintln(w, "\nA run's operation is full when every required stage is closed by one of its events and no event is an exception.")
	fmt.Fprintln(w, "\nstages, in order:")
	for i, st := range g.Stages {
		req := "optional"
		if st.Required {
			req = "required"
		}
		fmt.Fprintf(w, "  %d. %s (%s)", i+1, s(st.ID), req)
		if st.Phrase != "" {
			fmt.Fprintf(w, ": %s", st.Phrase)
		}
		switch st.Role {
		case "paid":
			fmt.Fprint(w, "; the guard counts money as moved when it is closed")
		case "outcome":
			fmt.Fprint(w, "; the guard counts the payment's outcome as seen when it is closed")
		}
		fmt.Fprintln(w)
		var by []string
		for _, m := range st.Match {
			if m.Role != "" {
				by = append(by, fmt.Sprintf("%s with role %s", s(m.Event), s(m.Role)))
			} else {
				by = append(by, s(m.Event)+" (any role)")
			}
		}
		fmt.Fprintf(w, "     closed by  %s\n", strings.Join(by, ", or "))
		if st.MissingExplanation != "" {
			fmt.Fprintf(w, "     if absent  %q\n", s(st.MissingExplanation))
		}
		for _, f := range st.Fields {
			fmt.Fprintf(w, "     needs      %s: %s\n", f.Path, f.Why)
		}
	}
	if len(g.Exceptions) > 0 {
		fmt.Fprintf(w, "\nexceptions (any one makes the operation partial): %s\n", s(strings.Join(g.Exceptions, ", ")))
	}
	fmt.Fprintln(w, "\nevery line needs:")
	for _, f := range g.Envelope {
		fmt.Fprintf(w, "  %-12s %s\n", f.Path, f.Why)
	}
	fmt.Fprintf(w, "\nhow the guard reads it: %s\n", s(g.Reading))
	if g.Completeness == receipt.Full {
		fmt.Fprintf(w, "\nan example run of one operation (events/run-1.ndjson; `haia-trace-mcp build events/run-1.ndjson --template %s` gives full):\n", shellJoin([]string{ref}))
	} else {
		fmt.Fprintf(w, "\nno run of this template can be full: %s. The nearest example:\n", s(g.Why))
	}
	for _, l := range g.Example {
		fmt.Fprintf(w, "%s\n", s(string(l)))
	}
}
