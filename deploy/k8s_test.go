package deploy

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// The names the manifests agree on.
const (
	k8sDir          = "kubernetes"
	namespace       = "haia-trace"
	serverContainer = "server"
	signerContainer = "signer"
	keySecretName   = "haia-trace-mcp-signing-key"
	traceClaimName  = "haia-trace-root"
	// The only containers allowed to touch the signing key: the signer and
	// the init container that installs its key file.
	keyInstallInit = "signing-key-install"
)

// k8sObject is one decoded document with where it came from.
type k8sObject struct {
	where string // file:document-number
	obj   runtime.Object
}

// newTyped returns an empty object of the API type for a kind, so that the
// strict decoder refuses every field that type does not have.
func newTyped(apiVersion, kind string) (runtime.Object, error) {
	switch apiVersion + "/" + kind {
	case "v1/Namespace":
		return &corev1.Namespace{}, nil
	case "v1/PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}, nil
	case "v1/Secret":
		return &corev1.Secret{}, nil
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1/Service":
		return &corev1.Service{}, nil
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, nil
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	}
	return nil, fmt.Errorf("apiVersion %q kind %q: not a type this test knows; add it to newTyped", apiVersion, kind)
}

// splitYAMLDocuments splits a multi-document YAML stream at "---" lines.
func splitYAMLDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		if len(bytes.TrimSpace(stripComments(cur.Bytes()))) > 0 {
			docs = append(docs, slices.Clone(cur.Bytes()))
		}
		cur.Reset()
	}
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		if t := bytes.TrimRight(line, " \t\r\n"); bytes.Equal(t, []byte("---")) {
			flush()
			continue
		}
		cur.Write(line)
	}
	flush()
	return docs
}

// stripComments drops whole-line comments, to tell an empty document.
func stripComments(doc []byte) []byte {
	var out []byte
	for _, line := range bytes.SplitAfter(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line...)
		}
	}
	return out
}

// decodeK8sDocument decodes one document strictly: unknown or duplicate
// fields and wrong types are errors.
func decodeK8sDocument(doc []byte) (runtime.Object, error) {
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return nil, fmt.Errorf("reading apiVersion and kind: %w", err)
	}
	obj, err := newTyped(meta.APIVersion, meta.Kind)
	if err != nil {
		return nil, err
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s: %w", meta.Kind, err)
	}
	return obj, nil
}

// k8sVariant is one topology: the manifests applied together.
type k8sVariant struct {
	name string
	// postgres: the guard's state in PostgreSQL (k8sPostgresDir's files in
	// place of the file store's Deployment); nothing writes the Trace root.
	postgres bool
	// tenants: one Trace root per tenant under --tenants-dir
	// (k8sTenantsDir's Deployment in place of the file store's).
	tenants bool
	// ingest: recorders post their events (--ingest) to the PostgreSQL
	// store and each pod keeps its own Trace root (an emptyDir); no claim.
	ingest   bool
	replicas int32
	files    []string
}

// k8sPostgresDir holds the PostgreSQL variant: its Deployment replaces
// deployment.yaml; the other manifests are shared.
const k8sPostgresDir = k8sDir + "/postgres"

// k8sTenantsDir holds the tenants variant: its Deployment replaces
// deployment.yaml; the other manifests are shared.
const k8sTenantsDir = k8sDir + "/tenants"

// k8sIngestDir holds the ingest variant: its Deployment replaces
// deployment.yaml, with the store's Secret of k8sPostgresDir, the shared
// manifests less the claim, and its Secret of ingest keys.
const k8sIngestDir = k8sDir + "/ingest"

func globManifests(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests under %s (err %v)", dir, err)
	}
	return files
}

func k8sVariants(t *testing.T) []k8sVariant {
	t.Helper()
	shared := globManifests(t, k8sDir)
	fileDeployment := filepath.Join(k8sDir, "deployment.yaml")
	if !slices.Contains(shared, fileDeployment) {
		t.Fatalf("no %s", fileDeployment)
	}
	pg := slices.DeleteFunc(slices.Clone(shared), func(f string) bool { return f == fileDeployment })
	noClaim := slices.DeleteFunc(slices.Clone(pg), func(f string) bool { return f == filepath.Join(k8sDir, "pvc.yaml") })
	return []k8sVariant{
		{name: "file store", replicas: 2, files: shared},
		{name: "postgres store", postgres: true, replicas: 3, files: append(slices.Clone(pg), globManifests(t, k8sPostgresDir)...)},
		{name: "tenants", tenants: true, replicas: 2, files: append(slices.Clone(pg), globManifests(t, k8sTenantsDir)...)},
		{name: "ingest", postgres: true, ingest: true, replicas: 3,
			files: slices.Concat(noClaim, []string{filepath.Join(k8sPostgresDir, "secret.yaml")}, globManifests(t, k8sIngestDir))},
	}
}

// eachK8s runs check as a subtest for every topology.
func eachK8s(t *testing.T, check func(t *testing.T, v k8sVariant, objs []k8sObject)) {
	for _, v := range k8sVariants(t) {
		t.Run(v.name, func(t *testing.T) { check(t, v, loadK8sFiles(t, v.files)) })
	}
}

// loadK8s is the file-store topology: every manifest of k8sDir.
func loadK8s(t *testing.T) []k8sObject {
	t.Helper()
	return loadK8sFiles(t, globManifests(t, k8sDir))
}

// loadAllK8s is every manifest of every topology, each once.
func loadAllK8s(t *testing.T) []k8sObject {
	t.Helper()
	return loadK8sFiles(t, slices.Concat(globManifests(t, k8sDir), globManifests(t, k8sPostgresDir), globManifests(t, k8sTenantsDir), globManifests(t, k8sIngestDir)))
}

func loadK8sFiles(t *testing.T, files []string) []k8sObject {
	t.Helper()
	var objs []k8sObject
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range splitYAMLDocuments(data) {
			where := fmt.Sprintf("%s document %d", f, i+1)
			obj, err := decodeK8sDocument(doc)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			objs = append(objs, k8sObject{where: where, obj: obj})
		}
	}
	return objs
}

func TestKubernetesStrictDecoding(t *testing.T) {
	eachK8s(t, func(t *testing.T, v k8sVariant, objs []k8sObject) {
		kinds := map[string]int{}
		for _, o := range objs {
			kinds[fmt.Sprintf("%T", o.obj)]++
		}
		if v.ingest && kinds["*v1.PersistentVolumeClaim"] != 0 {
			t.Errorf("the ingest topology applies a PersistentVolumeClaim; its pods share no volume")
		}
		for _, want := range []string{"*v1.Deployment", "*v1.Service", "*v1.Secret", "*v1.ConfigMap", "*v1.PersistentVolumeClaim", "*v1.Namespace"} {
			if want == "*v1.PersistentVolumeClaim" && v.ingest {
				continue
			}
			if kinds[want] == 0 {
				t.Errorf("no %s among the manifests (have %v)", want, kinds)
			}
		}
		if kinds["*v1.Deployment"] != 1 {
			t.Errorf("%d Deployments; a topology has one", kinds["*v1.Deployment"])
		}
	})
}

// TestStrictDecoderRefuses keeps the strict decoding honest: the checks above
// mean something only if a typo'd or duplicated field fails.
func TestStrictDecoderRefuses(t *testing.T) {
	cases := []struct{ name, doc string }{
		{"unknown field", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selectr: {a: b}}\n"},
		{"duplicate field", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\ndata: {c: d}\n"},
		{"wrong type", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: many}\n"},
		{"unknown kind", "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := decodeK8sDocument([]byte(c.doc)); err == nil {
				t.Errorf("decoded without error:\n%s", c.doc)
			}
		})
	}
}

// find returns the single object of type T named name, failing otherwise.
func find[T runtime.Object](t *testing.T, objs []k8sObject, name string) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if v, ok := o.obj.(T); ok {
			if m, ok := any(v).(interface{ GetName() string }); ok && m.GetName() == name {
				found = append(found, v)
			}
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want exactly one %T named %q, found %d", zero, name, len(found))
	}
	return found[0]
}

func TestKubernetesNamespaces(t *testing.T) {
	for _, o := range loadAllK8s(t) {
		m, ok := o.obj.(interface{ GetNamespace() string })
		if _, isNS := o.obj.(*corev1.Namespace); !ok || isNS {
			continue
		}
		if got := m.GetNamespace(); got != namespace {
			t.Errorf("%s: namespace %q, want %q", o.where, got, namespace)
		}
	}
}

func allContainers(spec *corev1.PodSpec) []corev1.Container {
	return append(slices.Clone(spec.InitContainers), spec.Containers...)
}

func TestKubernetesPodSecurity(t *testing.T) { eachK8s(t, checkPodSecurity) }

func checkPodSecurity(t *testing.T, _ k8sVariant, objs []k8sObject) {
	dep := find[*appsv1.Deployment](t, objs, "haia-trace-mcp")
	pod := &dep.Spec.Template.Spec
	psc := pod.SecurityContext
	if psc == nil {
		t.Fatal("pod has no securityContext")
	}
	if psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Error("pod: runAsNonRoot is not true")
	}
	if psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Error("pod: runAsUser unset or 0; the image's user is 65532")
	}
	if psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("pod: seccompProfile is not RuntimeDefault")
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("pod: automountServiceAccountToken should be false (the server never calls the API)")
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Error("pod: shares a host namespace")
	}
	for _, c := range allContainers(pod) {
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("container %s: no securityContext", c.Name)
			continue
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("container %s: allowPrivilegeEscalation is not false", c.Name)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("container %s: readOnlyRootFilesystem is not true", c.Name)
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("container %s: privileged", c.Name)
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			t.Errorf("container %s: runs as uid 0", c.Name)
		}
		if sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot {
			t.Errorf("container %s: runAsNonRoot false", c.Name)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("container %s: capabilities do not drop ALL", c.Name)
		} else if len(sc.Capabilities.Add) != 0 {
			t.Errorf("container %s: adds capabilities %v", c.Name, sc.Capabilities.Add)
		}
		if sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeUnconfined {
			t.Errorf("container %s: seccomp Unconfined", c.Name)
		}
		if c.Resources.Limits.Memory().IsZero() || c.Resources.Limits.Cpu().IsZero() {
			t.Errorf("container %s: no cpu and memory limits", c.Name)
		}
		if c.Resources.Requests.Memory().IsZero() {
			t.Errorf("container %s: no memory request", c.Name)
		}
		if !imagePinned(c.Image) {
			t.Errorf("container %s: image %q is neither digest-pinned nor an exact tag", c.Name, c.Image)
		}
	}
}

// imagePinned accepts name@sha256:<64 hex>, or an explicit tag that is not
// "latest" (the project's own image, which the operator replaces).
func imagePinned(ref string) bool {
	if name, digest, ok := strings.Cut(ref, "@"); ok {
		hex, ok := strings.CutPrefix(digest, "sha256:")
		return ok && name != "" && len(hex) == 64 && strings.Trim(hex, "0123456789abcdef") == ""
	}
	slash := strings.LastIndex(ref, "/")
	colon := strings.LastIndex(ref, ":")
	return colon > slash && ref[colon+1:] != "" && ref[colon+1:] != "latest"
}

// Every image but the operator's own (haia-trace-mcp, a placeholder for
// their registry's) names its registry: short names are resolved
// differently, or refused, by container runtimes.
func TestImagesFullyQualified(t *testing.T) {
	for _, o := range loadAllK8s(t) {
		d, ok := o.obj.(*appsv1.Deployment)
		if !ok {
			continue
		}
		for _, c := range allContainers(&d.Spec.Template.Spec) {
			if strings.HasPrefix(c.Image, "haia-trace-mcp:") {
				continue
			}
			if !fullyQualified(c.Image) {
				t.Errorf("%s: container %s: image %q is a short name; name its registry", o.where, c.Name, c.Image)
			}
		}
	}
	for _, v := range composeVariants() {
		c := loadComposeFile(t, v.file)
		for name, s := range c.Services {
			if s.Image != "" && !strings.HasPrefix(s.Image, "haia-trace-mcp:") && !fullyQualified(s.Image) {
				t.Errorf("%s: service %s: image %q is a short name; name its registry", v.file, name, s.Image)
			}
		}
	}
	for ref, want := range map[string]bool{"busybox:1": false, "docker.io/library/busybox:1": true, "localhost/x:1": true, "registry:5000/x:1": true, "library/busybox:1": false} {
		if fullyQualified(ref) != want {
			t.Errorf("fullyQualified(%q) != %v", ref, want)
		}
	}
}

func TestImagePinned(t *testing.T) {
	cases := map[string]bool{
		"busybox:1.37.0@sha256:9db7b59979c38555a39def84a31fb98b5296952f9e3afd4f6f11f05b07adfab0": true,
		"haia-trace-mcp:0.1.0":                      true,
		"registry:5000/haia:1.2":                    true,
		"busybox":                                   false,
		"busybox:latest":                            false,
		"registry:5000/haia":                        false,
		"busybox@sha256:abc":                        false,
		"busybox@sha512:" + strings.Repeat("a", 64): false,
	}
	for ref, want := range cases {
		if got := imagePinned(ref); got != want {
			t.Errorf("imagePinned(%q) = %v, want %v", ref, got, want)
		}
	}
}

func container(t *testing.T, pod *corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range allContainers(pod) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q in the pod", name)
	return corev1.Container{}
}

func TestKubernetesProbes(t *testing.T) { eachK8s(t, checkProbes) }

func checkProbes(t *testing.T, _ k8sVariant, objs []k8sObject) {
	dep := find[*appsv1.Deployment](t, objs, "haia-trace-mcp")
	srv := container(t, &dep.Spec.Template.Spec, serverContainer)
	probes := []struct {
		name string
		p    *corev1.Probe
		path string
	}{
		{"livenessProbe", srv.LivenessProbe, "/healthz"},
		{"readinessProbe", srv.ReadinessProbe, "/readyz"},
	}
	for _, pr := range probes {
		if pr.p == nil || pr.p.HTTPGet == nil {
			t.Errorf("server %s: want an httpGet probe on %s", pr.name, pr.path)
			continue
		}
		if pr.p.HTTPGet.Path != pr.path {
			t.Errorf("server %s: path %q, want %q", pr.name, pr.p.HTTPGet.Path, pr.path)
		}
		if !portDeclared(srv, pr.p.HTTPGet.Port) {
			t.Errorf("server %s: port %s is not a port of the container", pr.name, pr.p.HTTPGet.Port.String())
		}
	}
	if srv.StartupProbe != nil && srv.StartupProbe.HTTPGet != nil && !portDeclared(srv, srv.StartupProbe.HTTPGet.Port) {
		t.Errorf("server startupProbe: port %s is not a port of the container", srv.StartupProbe.HTTPGet.Port.String())
	}
	// Every path a probe asks for must be served by the binary: look for
	// it as a route literal in the HTTP wiring's source.
	for _, pr := range probes {
		if pr.p != nil && pr.p.HTTPGet != nil {
			checkRouteExists(t, pr.p.HTTPGet.Path)
		}
	}
}

func portDeclared(c corev1.Container, p intstr.IntOrString) bool {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return true
		}
	}
	return false
}

// checkRouteExists fails unless some non-test Go file of the module outside
// deploy/ holds the path as a string literal.
func checkRouteExists(t *testing.T, path string) {
	t.Helper()
	lit := []byte(`"` + path + `"`)
	found := false
	err := filepath.WalkDir("..", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "deploy", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if found || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		found = bytes.Contains(data, lit)
		return nil
	})
	if err != nil {
		t.Fatalf("searching the source for route %s: %v", path, err)
	}
	if !found {
		t.Errorf("probe path %s: no Go source outside deploy/ serves it (no %s literal)", path, lit)
	}
}

// TestKubernetesKeyIsolation: only the signer side of the pod mounts the
// signing key, in any form; the network-facing container never does.
func TestKubernetesKeyIsolation(t *testing.T) { eachK8s(t, checkKeyIsolation) }

func checkKeyIsolation(t *testing.T, _ k8sVariant, objs []k8sObject) {
	dep := find[*appsv1.Deployment](t, objs, "haia-trace-mcp")
	pod := &dep.Spec.Template.Spec
	// keyVolumes: the Secret's volume, and the emptyDir the install step
	// copies it into (every volume the install container writes).
	keyVolumes := map[string]bool{}
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.SecretName == keySecretName {
			keyVolumes[v.Name] = true
		}
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.Secret != nil && s.Secret.Name == keySecretName {
					keyVolumes[v.Name] = true
				}
			}
		}
	}
	if len(keyVolumes) == 0 {
		t.Fatalf("no volume carries the Secret %s", keySecretName)
	}
	install := container(t, pod, keyInstallInit)
	for _, m := range install.VolumeMounts {
		if !m.ReadOnly {
			keyVolumes[m.Name] = true
		}
	}
	allowed := map[string]bool{signerContainer: true, keyInstallInit: true}
	for _, c := range allContainers(pod) {
		for _, m := range c.VolumeMounts {
			if keyVolumes[m.Name] && !allowed[c.Name] {
				t.Errorf("container %s mounts key volume %s; only %v may", c.Name, m.Name, allowed)
			}
		}
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil && e.SecretRef.Name == keySecretName {
				t.Errorf("container %s takes the key Secret as environment", c.Name)
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == keySecretName {
				t.Errorf("container %s takes the key Secret as environment", c.Name)
			}
		}
	}
	signer := container(t, pod, signerContainer)
	if len(signer.Ports) != 0 {
		t.Errorf("signer exposes ports %v; it talks over its unix socket only", signer.Ports)
	}
	srv := container(t, pod, serverContainer)
	if flagValue(srv.Args, "--key-file") != "" {
		t.Error("server is given --key-file; it must sign through --signer")
	}
	if !strings.HasPrefix(flagValue(srv.Args, "--signer"), "unix:") {
		t.Error("server has no --signer unix:PATH")
	}
	if a, b := flagValue(srv.Args, "--signer"), flagValue(signer.Args, "--listen"); a != b {
		t.Errorf("server --signer %q and signer --listen %q differ", a, b)
	}
}

// flagValue returns the value following name in args ("" when absent).
func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// TestKubernetesTraceMounts: events/ read-only for the server. With the file
// store guard/ is writable and the whole root is mounted writable only by the
// layout init container; with PostgreSQL no container writes the root and
// nothing mounts guard/.
func TestKubernetesTraceMounts(t *testing.T) { eachK8s(t, checkTraceMounts) }

func checkTraceMounts(t *testing.T, variant k8sVariant, objs []k8sObject) {
	dep := find[*appsv1.Deployment](t, objs, "haia-trace-mcp")
	pod := &dep.Spec.Template.Spec
	if variant.ingest {
		checkIngestPod(t, pod)
		return
	}
	traceVolumes := map[string]bool{}
	for _, v := range pod.Volumes {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == traceClaimName {
			traceVolumes[v.Name] = true
			if variant.postgres && !v.PersistentVolumeClaim.ReadOnly {
				t.Errorf("volume %s: the claim is not read-only; with the PostgreSQL store nothing writes the Trace root", v.Name)
			}
		}
	}
	if len(traceVolumes) == 0 {
		t.Fatalf("no volume uses the claim %s", traceClaimName)
	}
	pvc := find[*corev1.PersistentVolumeClaim](t, objs, traceClaimName)
	if !slices.Contains(pvc.Spec.AccessModes, corev1.ReadWriteMany) {
		t.Errorf("claim %s: access modes %v; replicas on several nodes need ReadWriteMany", traceClaimName, pvc.Spec.AccessModes)
	}
	if variant.tenants {
		checkTenantMounts(t, pod, traceVolumes)
		return
	}
	dir := flagValue(container(t, pod, serverContainer).Args, "--dir")
	if dir == "" {
		t.Fatal("server has no --dir")
	}
	var sawEvents, sawGuard bool
	for _, c := range allContainers(pod) {
		for _, m := range c.VolumeMounts {
			if !traceVolumes[m.Name] {
				continue
			}
			if variant.postgres && !m.ReadOnly {
				t.Errorf("container %s mounts the Trace root (subPath %q) writable; with the PostgreSQL store nothing writes it", c.Name, m.SubPath)
			}
			switch {
			case m.SubPath == "events" || m.SubPath == "events/":
				if !m.ReadOnly {
					t.Errorf("container %s mounts events/ writable", c.Name)
				}
				if c.Name == serverContainer {
					sawEvents = m.MountPath == dir+"/events"
				}
			case variant.postgres && strings.HasPrefix(m.SubPath, "guard"):
				t.Errorf("container %s mounts guard/; with the PostgreSQL store nothing under guard/ is mounted", c.Name)
			case m.SubPath == "guard" || m.SubPath == "guard/":
				if c.Name == serverContainer {
					sawGuard = m.MountPath == dir+"/guard" && !m.ReadOnly
				}
			case m.SubPath == "":
				if c.Name != "trace-layout" && !m.ReadOnly {
					t.Errorf("container %s mounts the whole Trace root writable (events/ included)", c.Name)
				}
				if variant.postgres && c.Name == serverContainer && m.MountPath == dir && m.ReadOnly {
					sawEvents = true
				}
			default:
				t.Errorf("container %s mounts unexpected subPath %q of the Trace root", c.Name, m.SubPath)
			}
		}
	}
	if !sawEvents {
		t.Errorf("server does not mount events/ read-only at %s/events", dir)
	}
	if !variant.postgres && !sawGuard {
		t.Errorf("server does not mount guard/ writable at %s/guard", dir)
	}
}

// checkTenantMounts: with --tenants-dir each tenant's events/ is mounted
// read-only and its guard/ writable at <tenants-dir>/<tenant>/, the only
// subPaths of the Trace volume; only the layout init container mounts the
// whole volume writable.
func checkTenantMounts(t *testing.T, pod *corev1.PodSpec, traceVolumes map[string]bool) {
	t.Helper()
	srv := container(t, pod, serverContainer)
	dir := flagValue(srv.Args, "--tenants-dir")
	if dir == "" || flagValue(srv.Args, "--dir") != "" {
		t.Fatalf("the tenants server takes --tenants-dir (%q) and no --dir (%q)", dir, flagValue(srv.Args, "--dir"))
	}
	if flagValue(srv.Args, "--tenant-claim") == "" {
		t.Error("the tenants server names no --tenant-claim")
	}
	events, guards := tenantMounts(t, pod)
	if len(events) < 2 {
		t.Errorf("the tenants Deployment serves %d tenants; the example should show how several are laid out", len(events))
	}
	if !maps.Equal(events, guards) {
		t.Errorf("tenants with events/ %v and with guard/ %v differ", events, guards)
	}
	for _, c := range allContainers(pod) {
		for _, m := range c.VolumeMounts {
			if !traceVolumes[m.Name] {
				continue
			}
			tenant, sub, _ := strings.Cut(m.SubPath, "/")
			switch {
			case m.SubPath == "":
				if c.Name != "trace-layout" && !m.ReadOnly {
					t.Errorf("container %s mounts the whole Trace volume writable (events/ included)", c.Name)
				}
			case c.Name != serverContainer:
				t.Errorf("container %s mounts subPath %q of the Trace volume", c.Name, m.SubPath)
			case sub == "events" && (!m.ReadOnly || m.MountPath != dir+"/"+tenant+"/events"):
				t.Errorf("tenant %s: events/ must be read-only at %s/%s/events (mounted at %s, read-only %v)", tenant, dir, tenant, m.MountPath, m.ReadOnly)
			case sub == "guard" && (m.ReadOnly || m.MountPath != dir+"/"+tenant+"/guard"):
				t.Errorf("tenant %s: guard/ must be writable at %s/%s/guard (mounted at %s, read-only %v)", tenant, dir, tenant, m.MountPath, m.ReadOnly)
			case sub != "events" && sub != "guard":
				t.Errorf("container %s mounts unexpected subPath %q of the Trace volume", c.Name, m.SubPath)
			}
		}
	}
}

// tenantMounts names the tenants whose events/ and whose guard/ the server
// container mounts (subPath <tenant>/events, <tenant>/guard).
func tenantMounts(t *testing.T, pod *corev1.PodSpec) (events, guards map[string]bool) {
	t.Helper()
	events, guards = map[string]bool{}, map[string]bool{}
	for _, m := range container(t, pod, serverContainer).VolumeMounts {
		tenant, sub, ok := strings.Cut(m.SubPath, "/")
		switch {
		case ok && sub == "events":
			events[tenant] = true
		case ok && sub == "guard":
			guards[tenant] = true
		}
	}
	return events, guards
}

// TestKubernetesTenantsMatchesFileStore: the tenants Deployment differs from
// the file store's only in how the Trace root is given and mounted: the
// same probes, limits, security, signer and key installs.
func TestKubernetesTenantsMatchesFileStore(t *testing.T) {
	pods := map[string]*corev1.PodSpec{}
	for _, v := range k8sVariants(t) {
		pods[v.name] = &find[*appsv1.Deployment](t, loadK8sFiles(t, v.files), "haia-trace-mcp").Spec.Template.Spec
	}
	file, ten := pods["file store"], pods["tenants"]
	if file == nil || ten == nil {
		t.Fatalf("variants %v", slices.Collect(maps.Keys(pods)))
	}
	same := func(what string, a, b any) {
		t.Helper()
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s differs between the file-store and tenants Deployments:\n%+v\n%+v", what, a, b)
		}
	}
	same("pod securityContext", file.SecurityContext, ten.SecurityContext)
	same("volumes", file.Volumes, ten.Volumes)
	for _, name := range []string{signerContainer, keyInstallInit, "params-key-install"} {
		same("container "+name, container(t, file, name), container(t, ten, name))
	}
	a, b := container(t, file, serverContainer), container(t, ten, serverContainer)
	// The args, less how the root is named.
	rootless := func(args []string, flags ...string) []string {
		var out []string
		for i := 0; i < len(args); i++ {
			if slices.Contains(flags, args[i]) {
				i++
				continue
			}
			out = append(out, args[i])
		}
		return out
	}
	same("server args besides the root", rootless(a.Args, "--dir"), rootless(b.Args, "--tenants-dir", "--tenant-claim"))
	same("server image", a.Image, b.Image)
	same("server ports", a.Ports, b.Ports)
	same("server probes", []*corev1.Probe{a.StartupProbe, a.LivenessProbe, a.ReadinessProbe}, []*corev1.Probe{b.StartupProbe, b.LivenessProbe, b.ReadinessProbe})
	same("server securityContext", a.SecurityContext, b.SecurityContext)
	same("server resources", a.Resources, b.Resources)
}

// TestKubernetesWiring: every Secret, ConfigMap and key a pod refers to
// exists, the Service reaches the pod, and the file paths in the args lie
// under a mount of the right volume.
func TestKubernetesWiring(t *testing.T) { eachK8s(t, checkWiring) }

func checkWiring(t *testing.T, _ k8sVariant, objs []k8sObject) {
	dep := find[*appsv1.Deployment](t, objs, "haia-trace-mcp")
	pod := &dep.Spec.Template.Spec
	for _, v := range pod.Volumes {
		switch {
		case v.Secret != nil:
			s := find[*corev1.Secret](t, objs, v.Secret.SecretName)
			for _, it := range v.Secret.Items {
				if _, ok := s.StringData[it.Key]; !ok {
					t.Errorf("volume %s: Secret %s has no key %s", v.Name, s.Name, it.Key)
				}
			}
		case v.ConfigMap != nil:
			find[*corev1.ConfigMap](t, objs, v.ConfigMap.Name)
		}
	}
	for _, c := range allContainers(pod) {
		for _, e := range c.Env {
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				continue
			}
			ref := e.ValueFrom.SecretKeyRef
			if s := find[*corev1.Secret](t, objs, ref.Name); !hasKey(s, ref.Key) {
				t.Errorf("container %s: env %s: Secret %s has no key %s", c.Name, e.Name, ref.Name, ref.Key)
			}
		}
	}
	svc := find[*corev1.Service](t, objs, "haia-trace-mcp")
	for k, want := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != want {
			t.Errorf("Service selector %s=%s does not match the pod labels %v", k, want, dep.Spec.Template.Labels)
		}
	}
	srv := container(t, pod, serverContainer)
	for _, p := range svc.Spec.Ports {
		if !portDeclared(srv, p.TargetPort) {
			t.Errorf("Service port %s: targetPort %s is not a server port", p.Name, p.TargetPort.String())
		}
	}
	// Each file argument must be a file the mounted volume provides.
	files := []struct {
		c      corev1.Container
		flag   string
		volume string
	}{
		{srv, "--auth-jwks", "jwks"},
		{srv, "--guard-config", "guard-config"},
		{srv, "--params-key-file", "params-key"},
		{container(t, pod, signerContainer), "--key-file", "signing-key"},
	}
	for _, f := range files {
		path := flagValue(f.c.Args, f.flag)
		if path == "" {
			t.Errorf("container %s: no %s", f.c.Name, f.flag)
			continue
		}
		ok := false
		for _, m := range f.c.VolumeMounts {
			if m.Name == f.volume && filepath.Dir(path) == m.MountPath {
				ok = true
			}
		}
		if !ok {
			t.Errorf("container %s: %s %s is not in a mount of volume %s", f.c.Name, f.flag, path, f.volume)
		}
	}
}

// TestKubernetesSecretsArePlaceholders: no real key is ever committed.
func TestKubernetesSecretsArePlaceholders(t *testing.T) {
	for _, o := range loadAllK8s(t) {
		s, ok := o.obj.(*corev1.Secret)
		if !ok {
			continue
		}
		values := map[string][]byte{}
		for k, v := range s.StringData {
			values[k] = []byte(v)
		}
		for k, v := range s.Data {
			values[k] = v
		}
		for k, v := range values {
			if b, _ := pem.Decode(v); b != nil {
				t.Errorf("%s: Secret %s key %s holds a PEM block; commit placeholders only", o.where, s.Name, k)
			}
			var jwks struct {
				Keys []map[string]any `json:"keys"`
			}
			if u, err := url.Parse(strings.TrimSpace(string(v))); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
				if pw, set := u.User.Password(); set && !strings.Contains(pw, "REPLACE-ME") {
					t.Errorf("%s: Secret %s key %s holds a DSN with a real-looking password; commit REPLACE-ME placeholders only", o.where, s.Name, k)
				}
			}
			if json.Unmarshal(v, &jwks) == nil {
				for _, key := range jwks.Keys {
					if _, private := key["d"]; private {
						t.Errorf("%s: Secret %s key %s holds a private JWK", o.where, s.Name, k)
					}
				}
			}
		}
	}
}

// TestGuardConfigExamples: the ConfigMap's policy and deploy's example file
// are the same policy, and the guard accepts it.
func TestGuardConfigExamples(t *testing.T) {
	file, err := os.ReadFile("haia-guard.config.json")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := guard.ParseConfig(file, "."); err != nil {
		t.Errorf("haia-guard.config.json: %v", err)
	}
	cm := find[*corev1.ConfigMap](t, loadK8s(t), "haia-trace-mcp-guard")
	inMap, ok := cm.Data["haia-guard.config.json"]
	if !ok {
		t.Fatal("ConfigMap haia-trace-mcp-guard has no haia-guard.config.json")
	}
	if _, err := guard.ParseConfig([]byte(inMap), "."); err != nil {
		t.Errorf("ConfigMap haia-trace-mcp-guard: %v", err)
	}
	var a, b bytes.Buffer
	if err := json.Compact(&a, file); err != nil {
		t.Fatal(err)
	}
	if err := json.Compact(&b, []byte(inMap)); err != nil {
		t.Fatal(err)
	}
	if a.String() != b.String() {
		t.Errorf("the ConfigMap's policy differs from haia-guard.config.json:\n%s\n%s", b.String(), a.String())
	}
}

func hasKey(s *corev1.Secret, key string) bool {
	_, inString := s.StringData[key]
	_, inData := s.Data[key]
	return inString || inData
}

const (
	storeSecretName = "haia-trace-mcp-store"
	storeEnv        = "HAIA_STORE"
	migrateInit     = "store-migrate"
	// The store Secret's keys: the DSN of the role that owns the tables,
	// for the migration alone, and of the role the server runs as.
	ownerDSNKey   = "owner-dsn"
	runtimeDSNKey = "dsn"
)

// TestKubernetesPostgresStore: the PostgreSQL Deployment runs three replicas,
// each migrating the schema before its server starts; the owner's DSN
// reaches only the migration and the runtime role's only the server, each as
// HAIA_STORE from its own key of the Secret, and neither appears in a command
// line or ConfigMap; the migration grants the role the server's DSN names.
// The file-store Deployment sets no store at all.
func TestKubernetesPostgresStore(t *testing.T) {
	eachK8s(t, func(t *testing.T, v k8sVariant, objs []k8sObject) {
		dep := find[*appsv1.Deployment](t, objs, "haia-trace-mcp")
		if dep.Spec.Replicas == nil {
			t.Errorf("replicas unset (1), want %d", v.replicas)
		} else if *dep.Spec.Replicas != v.replicas {
			t.Errorf("replicas %d, want %d", *dep.Spec.Replicas, v.replicas)
		}
		pod := &dep.Spec.Template.Spec
		for _, c := range allContainers(pod) {
			for _, w := range slices.Concat(c.Command, c.Args) {
				if strings.HasPrefix(w, "--store") || strings.Contains(w, "postgres://") || strings.Contains(w, "postgresql://") {
					t.Errorf("container %s: %q puts the store on the command line", c.Name, w)
				}
			}
			for _, e := range c.EnvFrom {
				if e.SecretRef != nil && e.SecretRef.Name == storeSecretName {
					t.Errorf("container %s takes all of Secret %s as environment; name HAIA_STORE alone", c.Name, storeSecretName)
				}
			}
		}
		for _, o := range objs {
			cm, ok := o.obj.(*corev1.ConfigMap)
			if !ok {
				continue
			}
			for k, val := range cm.Data {
				if strings.Contains(val, "postgres://") || strings.Contains(val, "postgresql://") || strings.Contains(val, storeEnv) {
					t.Errorf("%s: ConfigMap %s key %s holds the store's DSN; it belongs in Secret %s", o.where, cm.Name, k, storeSecretName)
				}
			}
		}
		// takers: the containers given HAIA_STORE, each from the Secret, by
		// the key each reads.
		takers := map[string]string{}
		for _, c := range allContainers(pod) {
			for _, e := range c.Env {
				ref := e.ValueFrom
				if ref != nil && ref.SecretKeyRef != nil && ref.SecretKeyRef.Name == storeSecretName && e.Name != storeEnv {
					t.Errorf("container %s: env %s takes key %s of Secret %s; a DSN goes in %s only", c.Name, e.Name, ref.SecretKeyRef.Key, storeSecretName, storeEnv)
				}
				if e.Name != storeEnv {
					continue
				}
				if e.Value != "" || ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != storeSecretName {
					t.Errorf("container %s: %s is not taken from Secret %s", c.Name, storeEnv, storeSecretName)
					continue
				}
				takers[c.Name] = ref.SecretKeyRef.Key
			}
		}
		for _, vol := range pod.Volumes {
			if vol.Secret != nil && vol.Secret.SecretName == storeSecretName {
				t.Errorf("volume %s presents Secret %s as files: every container mounting it would read both DSNs", vol.Name, storeSecretName)
			}
		}
		if !v.postgres {
			if len(takers) != 0 {
				t.Errorf("the file-store Deployment gives %s to %v", storeEnv, takers)
			}
			return
		}
		// The owner's DSN to the migration alone, the runtime role's to the
		// server alone.
		if want := map[string]string{serverContainer: runtimeDSNKey, migrateInit: ownerDSNKey}; !maps.Equal(takers, want) {
			t.Errorf("%s goes to containers from keys %v; want exactly %v", storeEnv, takers, want)
		}
		// An init container ends before any container starts.
		var migrate *corev1.Container
		for i := range pod.InitContainers {
			if pod.InitContainers[i].Name == migrateInit {
				migrate = &pod.InitContainers[i]
			}
		}
		if migrate == nil {
			t.Fatalf("no init container %s", migrateInit)
		}
		if !slices.Equal(migrate.Command, storeMigrateArgv()) {
			t.Errorf("init container %s runs %v, want %v", migrateInit, migrate.Command, storeMigrateArgv())
		}
		checkTwoRoles(t, objs, grantedRole(migrate.Args))
		if migrate.Image != container(t, pod, serverContainer).Image {
			t.Errorf("init container %s runs image %s, not the server's", migrateInit, migrate.Image)
		}
		if len(migrate.VolumeMounts) != 0 {
			t.Errorf("init container %s mounts %v; it needs only the DSN", migrateInit, migrate.VolumeMounts)
		}
		pdb := find[*policyv1.PodDisruptionBudget](t, objs, "haia-trace-mcp")
		if pdb.Spec.Selector == nil || !maps.Equal(pdb.Spec.Selector.MatchLabels, dep.Spec.Selector.MatchLabels) {
			t.Errorf("PodDisruptionBudget selector %v does not select the Deployment's pods %v", pdb.Spec.Selector, dep.Spec.Selector.MatchLabels)
		}
		if mu := pdb.Spec.MaxUnavailable; mu == nil || mu.Type != intstr.Int || mu.IntVal < 1 || mu.IntVal >= v.replicas {
			t.Errorf("PodDisruptionBudget maxUnavailable %v; want a number from 1 to %d", mu, v.replicas-1)
		}
	})
}

// checkTwoRoles: the migration grants role, the role the placeholder
// server DSN names; the owner's DSN names another; the Deployment's header
// tells the DBA to create role as a login role.
func checkTwoRoles(t *testing.T, objs []k8sObject, role string) {
	t.Helper()
	if role == "" {
		t.Fatalf("init container %s does not run store migrate --grant ROLE, the role the server runs as", migrateInit)
	}
	s := find[*corev1.Secret](t, objs, storeSecretName)
	user := func(key string) string {
		u, err := url.Parse(s.StringData[key])
		if err != nil || u.User == nil {
			t.Errorf("Secret %s key %s: %q is not a DSN naming its role", storeSecretName, key, s.StringData[key])
			return ""
		}
		return u.User.Username()
	}
	if got := user(runtimeDSNKey); got != role {
		t.Errorf("Secret %s key %s names role %q; the migration grants %q", storeSecretName, runtimeDSNKey, got, role)
	}
	if got := user(ownerDSNKey); got == role || got == "" {
		t.Errorf("Secret %s key %s names role %q; the owner must be another role than %q", storeSecretName, ownerDSNKey, got, role)
	}
	data, err := os.ReadFile(filepath.Join(k8sPostgresDir, "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte("#   CREATE ROLE "+role+" LOGIN PASSWORD")) {
		t.Errorf("%s/deployment.yaml's header does not tell the DBA to CREATE ROLE %s LOGIN PASSWORD …", k8sPostgresDir, role)
	}
}

// TestKubernetesPostgresMatchesFileStore: the PostgreSQL Deployment differs
// from the file store's only where the store does: the server runs with the
// same args, probes, limits and security; the signer and the key installs
// are the same containers; the pod's security is the same.
func TestKubernetesPostgresMatchesFileStore(t *testing.T) {
	var pods []*corev1.PodSpec
	for _, v := range k8sVariants(t) {
		pods = append(pods, &find[*appsv1.Deployment](t, loadK8sFiles(t, v.files), "haia-trace-mcp").Spec.Template.Spec)
	}
	file, pg := pods[0], pods[1]
	same := func(what string, a, b any) {
		t.Helper()
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s differs between the file-store and PostgreSQL Deployments:\n%+v\n%+v", what, a, b)
		}
	}
	same("pod securityContext", file.SecurityContext, pg.SecurityContext)
	same("automountServiceAccountToken", file.AutomountServiceAccountToken, pg.AutomountServiceAccountToken)
	for _, name := range []string{signerContainer, keyInstallInit, "params-key-install"} {
		same("container "+name, container(t, file, name), container(t, pg, name))
	}
	a, b := container(t, file, serverContainer), container(t, pg, serverContainer)
	same("server args", a.Args, b.Args)
	same("server image", a.Image, b.Image)
	same("server ports", a.Ports, b.Ports)
	same("server probes", []*corev1.Probe{a.StartupProbe, a.LivenessProbe, a.ReadinessProbe}, []*corev1.Probe{b.StartupProbe, b.LivenessProbe, b.ReadinessProbe})
	same("server securityContext", a.SecurityContext, b.SecurityContext)
	same("server resources", a.Resources, b.Resources)
}
