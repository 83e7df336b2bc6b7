package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The closed network: the Dockerfile built as written with no network at
// all, from a prepared context, and the image behind a port mapping that
// names its own host port.

const (
	offlineImage = "localhost/haia-trace-mcp:offline"
	goStandIn    = "localhost/haia-go-standin:test"
)

// prepareVendoredContext is what an operator prepares where the modules
// are: the checkout's files (tracked, or new and not ignored) and `go mod
// vendor`'s vendor/.
func prepareVendoredContext(t *testing.T) string {
	t.Helper()
	ctxDir := t.TempDir()
	out, err := exec.Command("git", "-C", "..", "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files (the context is the checkout's tracked files): %v", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join("..", name)
		st, err := os.Lstat(src)
		if err != nil || !st.Mode().IsRegular() {
			continue // deleted in the work tree, or a link the build does not need
		}
		copyFile(t, src, filepath.Join(ctxDir, name), st.Mode().Perm())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	vendor := exec.CommandContext(ctx, "go", "mod", "vendor", "-o", filepath.Join(ctxDir, "vendor"))
	vendor.Dir = ".."
	vendor.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	if b, err := vendor.CombinedOutput(); err != nil {
		t.Fatalf("go mod vendor: %v\n%s", err, b)
	}
	return ctxDir
}

func copyFile(t *testing.T, src, dst string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// buildGoStandIn builds a local stand-in for the golang base image, which
// cannot be pulled here: this machine's Go toolchain (the one running the
// test) at /usr/local/go, with a shell, mkdir and chmod copied from the host
// with the libraries they load, and the golang image's environment. The
// Dockerfile's build stage needs nothing else.
func buildGoStandIn(t *testing.T, p *podman) {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "rootfs")
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env GOROOT: %v", err)
	}
	goroot := strings.TrimSpace(string(out))
	skip := map[string]bool{"test": true, "api": true, "doc": true, "misc": true}
	err = filepath.WalkDir(goroot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(goroot, path)
		if d.IsDir() && (skip[rel] || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		dst := filepath.Join(root, "usr", "local", "go", rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, 0o755)
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			// A hard link where the file system allows it: the toolchain
			// is some hundred megabytes.
			if os.Link(path, dst) != nil {
				copyFile(t, path, dst, info.Mode().Perm())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("copying GOROOT %s: %v", goroot, err)
	}
	for _, bin := range []string{"sh", "mkdir", "chmod"} {
		path, err := exec.LookPath(bin)
		if err != nil {
			t.Fatalf("the stand-in needs %s from the host: %v", bin, err)
		}
		real, err := filepath.EvalSymlinks(path)
		if err != nil {
			t.Fatal(err)
		}
		copyFile(t, real, filepath.Join(root, "bin", bin), 0o755)
		libs, err := exec.Command("ldd", real).Output()
		if err != nil {
			continue // a static binary
		}
		for _, line := range strings.Split(string(libs), "\n") {
			for _, f := range strings.Fields(line) {
				if strings.HasPrefix(f, "/") {
					dst := filepath.Join(root, f)
					if _, err := os.Stat(dst); err == nil {
						continue
					}
					realLib, err := filepath.EvalSymlinks(f)
					if err != nil {
						t.Fatal(err)
					}
					copyFile(t, realLib, dst, 0o755)
				}
			}
		}
	}
	for _, d := range []string{"tmp", "root", "go"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	cf := "FROM scratch\nCOPY . /\n" +
		"ENV PATH=/usr/local/go/bin:/go/bin:/bin GOTOOLCHAIN=local GOPATH=/go HOME=/root\n"
	if err := os.WriteFile(filepath.Join(dir, "Containerfile"), []byte(cf), 0o644); err != nil {
		t.Fatal(err)
	}
	p.run("build", "--network=none", "--pull=never", "-f", filepath.Join(dir, "Containerfile"), "-t", goStandIn, root)
}

// containerOfflineBuild builds the Dockerfile as written, on a context
// prepared as docs/deployment.md says (the tracked files and vendor/), with
// --network=none and --pull=never: GOFLAGS=-mod=vendor and the base images
// given by local names (the Go stand-in, and scratch for distroless, which
// the static binary does not need). The same build without the vendored
// modules must fail for want of the network, so the network is really cut.
// The image built runs.
func containerOfflineBuild(t *testing.T, p *podman) {
	start := time.Now()
	ctxDir := prepareVendoredContext(t)
	buildGoStandIn(t, p)
	t.Logf("context and Go stand-in prepared in %v", time.Since(start).Round(time.Millisecond))
	build := []string{"build", "--network=none", "--pull=never", "--format", "docker",
		"--build-arg", "GO_IMAGE=" + goStandIn, "--build-arg", "RUNTIME_IMAGE=scratch", "-f", filepath.Join(ctxDir, "Dockerfile")}
	// The compiler's cache of this machine, when podman runs as root: the
	// stand-in's toolchain is this machine's, at the same path, so the
	// standard library and every unchanged package is compiled once. A
	// cache is no network; the build is the same without it, only slower.
	if out, err := exec.Command("go", "env", "GOCACHE").Output(); err == nil && !p.rootless {
		if cache := strings.TrimSpace(string(out)); filepath.IsAbs(cache) {
			build = append(build, "--volume", cache+":/root/.cache/go-build")
		}
	}
	args := func(extra ...string) []string {
		return append(append(append([]string{}, build...), extra...), ctxDir)
	}
	if out, errOut, code := p.try(args("-t", "localhost/haia-trace-mcp:online")...); code == 0 {
		t.Fatalf("the build without GOFLAGS=-mod=vendor succeeded with --network=none; the test does not cut the network\n%s", out)
	} else if !strings.Contains(out+errOut, "go mod download") {
		t.Fatalf("the build without the vendored modules failed, but not at the module download:\n%s%s", out, errOut)
	}
	start = time.Now()
	if out, errOut, code := p.tryWithin(30*time.Minute, args("--build-arg", "GOFLAGS=-mod=vendor", "-t", offlineImage)...); code != 0 {
		t.Fatalf("podman build --network=none of the vendored context: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("the image built offline in %v", time.Since(start).Round(time.Millisecond))
	out := p.run("run", "--rm", "--network", "none", "--read-only", "--read-only-tmpfs=false", "--passwd=false",
		"--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096", "--entrypoint", "/haia-trace-mcp", offlineImage, "version")
	if !strings.HasPrefix(out, "haia-trace-mcp ") {
		t.Errorf("the offline image's version: %q", out)
	}
	if user := strings.TrimSpace(p.run("image", "inspect", "--format", "{{.Config.User}}", offlineImage)); user != "65532:65532" {
		t.Errorf("the offline image runs as %q", user)
	}
}

// containerPortMapping runs the image behind a port mapping whose host port
// is not the container's: the Host clients send (127.0.0.1:PORT) is allowed
// with --http-allowed-host, another name through the same mapping is still
// 403 naming the flag, and tokens keep the resource URL the container
// listens on (http://0.0.0.0:3000/mcp) as their audience.
func containerPortMapping(t *testing.T, p *podman) {
	dir := t.TempDir()
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	secretText := []byte(hex.EncodeToString(secret))
	secretFile := filepath.Join(dir, "hmac-secret")
	if err := os.WriteFile(secretFile, secretText, 0o600); err != nil {
		t.Fatal(err)
	}
	p.chown(secretFile, p.uid)
	port := freePort(t)
	name := "port-mapping"
	for _, v := range []string{"mapped-trace", "mapped-config"} {
		p.try("volume", "rm", "-f", v)
	}
	p.run("run", "-d", "--name", name, "--read-only", "--read-only-tmpfs=false", "--passwd=false",
		"--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096",
		"-p", "127.0.0.1:"+port+":3000", "-v", "mapped-trace:/trace", "-v", "mapped-config:/etc/haia-trace-mcp",
		"-v", secretFile+":/run/secrets/hmac-secret:ro", imageName,
		"--dir", "/trace", "--auth-issuer", testIssuer, "--auth-hmac-secret", "/run/secrets/hmac-secret",
		"--http-allowed-host", "127.0.0.1:"+port)
	t.Cleanup(func() { p.with(t).try("rm", "-f", "-t", "2", name) })
	base := "http://127.0.0.1:" + port
	waitFor(t, p, name, "the mapped server's /healthz", func() bool {
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	post := func(host, token string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, base+"/mcp", strings.NewReader(`{}`))
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, b.String()
	}
	if code, body := post("localhost:"+port, ""); code != http.StatusForbidden || !strings.Contains(body, "--http-allowed-host") {
		t.Errorf("Host localhost:%s, not given: %d %q, want 403 naming --http-allowed-host", port, code, body)
	}
	if code, _ := post("127.0.0.1:"+port, ""); code != http.StatusUnauthorized {
		t.Errorf("Host 127.0.0.1:%s without a token: %d, want 401", port, code)
	}
	mint := func(aud string) string {
		tok, err := mintHS256(secretText, map[string]any{"iss": testIssuer, "aud": aud, "sub": "mapped-agent",
			"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	if code, _ := post("127.0.0.1:"+port, mint(base+"/mcp")); code != http.StatusUnauthorized {
		t.Errorf("a token for the mapped URL: %d, want 401 (the audience is the container's resource URL)", code)
	}
	cs := connectHTTP(t, base+"/mcp", mint("http://0.0.0.0:3000/mcp"))
	var ops struct {
		Operations []any `json:"operations"`
	}
	callJSON(t, cs, "list_operations", map[string]any{}, &ops)
	if ops.Operations == nil {
		t.Error("list_operations through the mapping gave no operations list")
	}
	cs.Close()
}
