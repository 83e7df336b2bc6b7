package deploy

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth/authtest"
)

// docsRunCommand is the `podman run -d …` command of docs/operations.md,
// continuation lines joined and split into words ("…" kept as one).
func docsRunCommand(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(data), -1) {
		joined := strings.ReplaceAll(block[1], "\\\n", " ")
		for _, line := range strings.Split(joined, "\n") {
			if strings.HasPrefix(line, "podman run -d ") {
				return shellWords(t, line)
			}
		}
	}
	t.Fatal("docs/operations.md has no `podman run -d` example")
	return nil
}

// shellWords splits a line at blanks, keeping "…" together (quotes
// dropped); enough for the examples, which use nothing else.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var cur strings.Builder
	inQuote, any := false, false
	for _, r := range line {
		switch {
		case r == '"':
			inQuote, any = !inQuote, true
		case (r == ' ' || r == '\t') && !inQuote:
			if any {
				words = append(words, cur.String())
				cur.Reset()
				any = false
			}
		default:
			cur.WriteRune(r)
			any = true
		}
	}
	if inQuote {
		t.Fatalf("unbalanced quote in %q", line)
	}
	if any {
		words = append(words, cur.String())
	}
	return words
}

// containerDocsRun runs docs/operations.md's `podman run` as written —
// the image name, the secrets directory and the published port standing in
// for the operator's — and waits for /readyz 200, then asks over MCP.
func containerDocsRun(t *testing.T, p *podman, bin string) {
	words := docsRunCommand(t)
	dir := t.TempDir()
	secrets := filepath.Join(dir, "secrets")
	if err := os.MkdirAll(secrets, 0o755); err != nil {
		t.Fatal(err)
	}
	flag := func(name string) string {
		for i, w := range words {
			if w == name && i+1 < len(words) {
				return words[i+1]
			}
		}
		t.Fatalf("the example passes no %s", name)
		return ""
	}
	publicURL := flag("--public-url")
	iss, err := authtest.NewIssuer(secrets, flag("--auth-issuer"), publicURL+"/mcp")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "reviewer", "init", "--id", "you@example.com", "--key-file", filepath.Join(dir, "reviewer.key"),
		"--reviewers", filepath.Join(secrets, "reviewers.json")).CombinedOutput(); err != nil {
		t.Fatalf("reviewer init: %v\n%s", err, out)
	}
	for _, f := range []string{"jwks.json", "reviewers.json"} {
		if err := os.Chmod(filepath.Join(secrets, f), 0o644); err != nil { // as the example's chmod
			t.Fatal(err)
		}
	}
	port := freePort(t)
	name := "docs-run"
	var args []string
	for _, w := range words[2:] { // after "podman run"
		w = strings.ReplaceAll(w, "$PWD", dir)
		switch {
		case w == "localhost/haia-trace-mcp:0.1.0":
			w = imageName
		case w == "127.0.0.1:3000:3000":
			w = "127.0.0.1:" + port + ":3000"
		}
		args = append(args, w)
	}
	for _, v := range []string{"trace", "haia-config"} {
		p.try("volume", "rm", "-f", v)
	}
	// args starts with the example's own "-d"; the name and ulimits are
	// the test's (a fixed name to clean up; podman's default limits).
	p.run(append([]string{"run", "--name", name, "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"}, args...)...)
	t.Cleanup(func() { p.with(t).try("rm", "-f", "-t", "2", name) })
	base := "http://127.0.0.1:" + port
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			out, errOut, _ := p.try("logs", name)
			t.Fatalf("the example's container never became ready (/readyz):\n%s%s", out, errOut)
		}
		time.Sleep(200 * time.Millisecond)
	}
	tok, err := iss.Token("docs-agent", []string{"trace:read"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(strings.TrimPrefix(publicURL, "https://"), "http://")
	client := mcp.NewClient(&mcp.Implementation{Name: "docs-run", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp",
		HTTPClient: &http.Client{Transport: hostTransport{host: host, token: tok}}, MaxRetries: -1}, nil)
	if err != nil {
		out, errOut, _ := p.try("logs", name)
		t.Fatalf("connect to the example's container: %v\n%s%s", err, out, errOut)
	}
	defer cs.Close()
	var ops struct {
		Operations []any `json:"operations"`
	}
	callJSON(t, cs, "list_operations", map[string]any{}, &ops)
}
