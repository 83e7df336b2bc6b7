package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
)

func TestShortVersion(t *testing.T) {
	rev := "981a7416afb246531c22526082183323d891ea9e"
	cases := []struct {
		name string
		b    buildFacts
		want string
	}{
		{"released module", buildFacts{module: "v1.2.3", revision: rev}, "1.2.3"},
		{"pseudo-version", buildFacts{module: "v0.0.0-20260901120000-981a7416afb2"}, "0.0.0-20260901120000-981a7416afb2"},
		{"module version of a dirty tree", buildFacts{module: "v1.2.4-0.20260901120000-981a7416afb2+dirty", modified: true}, "1.2.4-0.20260901120000-981a7416afb2+dirty"},
		{"devel with revision", buildFacts{module: "(devel)", revision: rev}, "dev+981a7416afb2"},
		{"devel, modified tree", buildFacts{module: "(devel)", revision: rev, modified: true}, "dev+981a7416afb2.dirty"},
		{"short revision kept whole", buildFacts{module: "(devel)", revision: "abc"}, "dev+abc"},
		{"no revision (-buildvcs=false)", buildFacts{module: "(devel)"}, "dev"},
		{"no build info", buildFacts{}, "dev"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := shortVersion(c.b)
			if got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
			if strings.ContainsAny(got, " \t\n") {
				t.Errorf("%q has white space; serverInfo.version is a token, not a sentence", got)
			}
			s := versionSentence(c.b)
			if !strings.HasPrefix(s, "haia-trace-mcp version "+got+" ") {
				t.Errorf("sentence %q does not start with the version %q", s, got)
			}
		})
	}
}

// versionToken is what serverInfo.version may look like.
var versionToken = regexp.MustCompile(`^(dev(\+[0-9a-f]{1,12}(\.dirty)?)?|[0-9]+\.[0-9]+\.[0-9]+[0-9A-Za-z.+-]*)$`)

// TestVersionAgrees: `version` and `--version` print the same sentence,
// and the MCP initialize answer carries the short version inside it.
func TestVersionAgrees(t *testing.T) {
	a, _, codeA := runCLI(t, "version")
	b, _, codeB := runCLI(t, "--version")
	if codeA != 0 || codeB != 0 || a != b {
		t.Fatalf("version (exit %d) %q and --version (exit %d) %q differ", codeA, a, codeB, b)
	}
	if _, _, code := runCLI(t, "version", "extra"); code != exitUsage {
		t.Errorf("version extra: exit %d, want %d", code, exitUsage)
	}
	cs := mcpSession(t, nil, "--dir", sampleRoot(t))
	info := cs.InitializeResult().ServerInfo
	if info == nil {
		t.Fatal("no serverInfo in the initialize answer")
	}
	if info.Name != "haia-trace-mcp" || !versionToken.MatchString(info.Version) {
		t.Errorf("serverInfo %+v; want name haia-trace-mcp and a version token", info)
	}
	if !strings.Contains(a, "version "+info.Version+" ") {
		t.Errorf("`version` says %q; serverInfo.version is %q", a, info.Version)
	}
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Errorf("the session does not work after initialize: %v", err)
	}
}
