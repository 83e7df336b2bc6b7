package deploy

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// The ingest keys' Secret and its one key, the keys file.
const (
	ingestKeysSecretName = "haia-trace-mcp-ingest-keys"
	ingestKeysKey        = "ingest-keys.json"
)

// The ingest variants' shape: --ingest on, each replica's Trace root its
// own and writable, the keys file (hashes only) read-only from a directory
// of the operator's, nothing else of the PostgreSQL topology changed.

// ingestKeysFile is the keys file a server's arguments name.
func ingestKeysFile(t *testing.T, where string, args []string) string {
	t.Helper()
	if !slices.Contains(args, "--ingest") {
		t.Errorf("%s: no --ingest; recorders' batches would be 404", where)
	}
	keys := flagValue(args, "--ingest-keys")
	if !strings.HasPrefix(keys, "/") {
		t.Errorf("%s: --ingest-keys %q is not an absolute path (the default lies beside the reviewers file, a secret of its own)", where, keys)
	}
	return keys
}

// checkComposeIngestMounts: no Trace volume is shared; each replica mounts
// a volume of its own, writable, at --dir, and nothing else of the Trace;
// the keys' directory read-only (a directory, so a replaced keys file is
// seen); the signer's socket the only volume it shares.
func checkComposeIngestMounts(t *testing.T, c *composeFile) {
	t.Helper()
	if _, ok := c.Volumes["trace"]; ok {
		t.Error("a top-level volume named trace: with ingest no Trace volume is shared")
	}
	owners := map[string][]string{} // volume → services mounting it
	for name, s := range c.Services {
		for _, m := range s.Volumes {
			if m.Type == "volume" {
				owners[m.Source] = append(owners[m.Source], name)
			}
		}
	}
	signerName, signer := signerService(t, c)
	servers := serverServices(c)
	var keysDir string
	for _, name := range servers {
		s := c.Services[name]
		dir := flagValue(s.Command, "--dir")
		keys := ingestKeysFile(t, "service "+name, s.Command)
		var root, keysMount bool
		for _, m := range s.Volumes {
			switch {
			case m.Target == dir:
				root = m.Type == "volume" && !m.ReadOnly && m.Volume.Subpath == ""
				if got := owners[m.Source]; len(got) != 1 {
					t.Errorf("service %s: its Trace root, volume %s, is mounted by %v; a replica's root is its own", name, m.Source, got)
				}
			case m.Target == filepath.Dir(keys):
				keysMount = m.Type == "bind" && m.ReadOnly && strings.HasPrefix(m.Source, "./")
				if keysDir != "" && keysDir != m.Source {
					t.Errorf("service %s reads the keys from %s, another replica from %s", name, m.Source, keysDir)
				}
				keysDir = m.Source
			case strings.HasPrefix(keys, m.Target+"/"):
				t.Errorf("service %s: --ingest-keys %s lies under %s, not directly in the mounted directory", name, keys, m.Target)
			case m.Type == "volume" && slices.ContainsFunc(signer.Volumes, func(sm composeMount) bool { return sm.Source == m.Source && sm.Target == m.Target }):
				// The signer's socket.
			default:
				t.Errorf("service %s mounts %s %s at %s; a replica mounts its own root, the keys and the signer's socket", name, m.Type, m.Source, m.Target)
			}
		}
		if !root {
			t.Errorf("service %s: no volume of its own mounted writable at --dir %s", name, dir)
		}
		if !keysMount {
			t.Errorf("service %s: the directory of --ingest-keys %s is not a read-only bind mount of the operator's directory beside the compose file", name, keys)
		}
		for _, sec := range s.Secrets {
			if strings.Contains(sec, "ingest") {
				t.Errorf("service %s: secret %s: a compose secret is a mount of one file, which a replaced keys file leaves stale", name, sec)
			}
		}
		for k := range s.Environment {
			if strings.Contains(strings.ToUpper(k), "INGEST") {
				t.Errorf("service %s: environment %s; the key belongs to the recorder, the replicas read hashes from the keys file", name, k)
			}
		}
	}
	for vol, users := range owners {
		if len(users) > 1 && !slices.Contains(users, signerName) {
			t.Errorf("volume %s is shared by %v; only the signer's socket is shared", vol, users)
		}
	}
}

// TestComposeIngestMatchesPostgres: the ingest compose file is the
// PostgreSQL one with --ingest and its keys added to the same command,
// the same services otherwise (less trace-init, which only filled the
// shared volume), the same database, migration, signer and hardening.
func TestComposeIngestMatchesPostgres(t *testing.T) {
	pg, in := loadComposeFile(t, "compose.postgres.yaml"), loadComposeFile(t, "compose.ingest.yaml")
	pgServers, inServers := serverServices(pg), serverServices(in)
	if len(pgServers) != len(inServers) {
		t.Fatalf("replicas %v and %v", pgServers, inServers)
	}
	for i, name := range inServers {
		a, b := pg.Services[pgServers[i]], in.Services[name]
		keys := flagValue(b.Command, "--ingest-keys")
		if want := append(slices.Clone(a.Command), "--ingest", "--ingest-keys", keys); !slices.Equal(b.Command, want) {
			t.Errorf("service %s's command:\n%q\nwant compose.postgres.yaml's with --ingest --ingest-keys:\n%q", name, b.Command, want)
		}
		for what, same := range map[string]bool{
			"env_file":    slices.Equal(a.EnvFile, b.EnvFile),
			"secrets":     slices.Equal(a.Secrets, b.Secrets),
			"networks":    slices.Equal(a.Networks, b.Networks),
			"ports":       slices.Equal(a.Ports, b.Ports),
			"user":        a.User == b.User && a.ReadOnly == b.ReadOnly && slices.Equal(a.CapDrop, b.CapDrop) && slices.Equal(a.SecurityOpt, b.SecurityOpt),
			"image":       a.Image == b.Image && a.Build == b.Build,
			"limits":      a.Deploy == b.Deploy,
			"healthcheck": a.Healthcheck != nil && b.Healthcheck != nil && slices.Equal(a.Healthcheck.Test, b.Healthcheck.Test),
		} {
			if !same {
				t.Errorf("service %s: %s differs from compose.postgres.yaml's %s", name, what, pgServers[i])
			}
		}
		if _, ok := b.DependsOn["trace-init"]; ok {
			t.Errorf("service %s waits for trace-init; with ingest there is no shared volume to fill", name)
		}
	}
	for name, a := range pg.Services {
		if len(a.Ports) > 0 || name == "trace-init" {
			continue
		}
		b, ok := in.Services[name]
		if !ok {
			t.Errorf("compose.ingest.yaml has no service %s", name)
			continue
		}
		if !slices.Equal(a.Entrypoint, b.Entrypoint) || !slices.Equal(a.Command, b.Command) || !slices.Equal(a.EnvFile, b.EnvFile) ||
			!slices.Equal(a.Secrets, b.Secrets) || a.Image != b.Image || a.User != b.User || !slices.Equal(a.Configs, b.Configs) {
			t.Errorf("service %s differs from compose.postgres.yaml's", name)
		}
	}
	if _, ok := in.Services["trace-init"]; ok {
		t.Error("compose.ingest.yaml has trace-init; with ingest there is no shared volume to fill")
	}
}

// checkIngestPod: no claim; the server's --dir an emptyDir of the pod's
// own, writable by the server alone (and the trace-layout init container,
// which makes events/ and guard/ in it); the keys file in a directory mount of
// the keys' Secret (no subPath, which the kubelet would never update),
// read-only, the server's alone.
func checkIngestPod(t *testing.T, pod *corev1.PodSpec) {
	t.Helper()
	srv := container(t, pod, serverContainer)
	dir := flagValue(srv.Args, "--dir")
	keys := ingestKeysFile(t, "the server", srv.Args)
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
		if v.PersistentVolumeClaim != nil {
			t.Errorf("volume %s uses claim %s; the ingest pods share no volume", v.Name, v.PersistentVolumeClaim.ClaimName)
		}
		if v.Secret != nil && v.Secret.SecretName == ingestKeysSecretName && len(v.Secret.Items) != 0 {
			t.Errorf("volume %s picks items %v of Secret %s; mount it whole", v.Name, v.Secret.Items, ingestKeysSecretName)
		}
	}
	var root, keysMount string
	for _, m := range srv.VolumeMounts {
		v := volumes[m.Name]
		switch {
		case m.MountPath == dir:
			root = m.Name
			if v.EmptyDir == nil || m.ReadOnly || m.SubPath != "" {
				t.Errorf("the server's --dir %s is volume %s (read-only %v, subPath %q); want an emptyDir of the pod's own, writable", dir, m.Name, m.ReadOnly, m.SubPath)
			}
		case m.MountPath == filepath.Dir(keys):
			keysMount = m.Name
			if v.Secret == nil || v.Secret.SecretName != ingestKeysSecretName || !m.ReadOnly || m.SubPath != "" {
				t.Errorf("the directory of --ingest-keys %s is volume %s; want Secret %s, read-only, whole (no subPath)", keys, m.Name, ingestKeysSecretName)
			}
		}
	}
	if root == "" || keysMount == "" {
		t.Fatalf("the server mounts no volume at --dir %s (%q) or at the keys' directory %s (%q)", dir, root, filepath.Dir(keys), keysMount)
	}
	if filepath.Base(keys) != ingestKeysKey {
		t.Errorf("--ingest-keys %s is not the Secret's key %s", keys, ingestKeysKey)
	}
	for _, c := range allContainers(pod) {
		if c.Name == serverContainer {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.Name == root && c.Name == "trace-layout" && slices.Equal(c.Command, []string{"/bin/mkdir", "-p", dir + "/events", dir + "/guard"}) {
				continue // lays the empty root out, before the server starts
			}
			if m.Name == root || m.Name == keysMount {
				t.Errorf("container %s mounts %s; the server's alone", c.Name, m.Name)
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == ingestKeysSecretName {
				t.Errorf("container %s takes the ingest keys as environment", c.Name)
			}
		}
	}
}

// TestKubernetesIngestMatchesPostgres: the ingest Deployment is the
// PostgreSQL one with --ingest and its keys added to the same args, the
// Trace root an emptyDir instead of the claim, the keys' Secret mounted,
// and a longer startup budget for the first copy; everything else — init
// containers, signer, env, probes' paths, limits, security, replicas — the
// same.
func TestKubernetesIngestMatchesPostgres(t *testing.T) {
	deps := map[string]*appsv1.Deployment{}
	for _, v := range k8sVariants(t) {
		deps[v.name] = find[*appsv1.Deployment](t, loadK8sFiles(t, v.files), "haia-trace-mcp")
	}
	pgDep, inDep := deps["postgres store"], deps["ingest"]
	if pgDep == nil || inDep == nil {
		t.Fatal("no postgres store or ingest variant")
	}
	pg, in := &pgDep.Spec.Template.Spec, &inDep.Spec.Template.Spec
	same := func(what string, a, b any) {
		t.Helper()
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s differs between the PostgreSQL and ingest Deployments:\n%+v\n%+v", what, a, b)
		}
	}
	same("replicas", pgDep.Spec.Replicas, inDep.Spec.Replicas)
	same("strategy", pgDep.Spec.Strategy, inDep.Spec.Strategy)
	same("pod securityContext", pg.SecurityContext, in.SecurityContext)
	same("automountServiceAccountToken", pg.AutomountServiceAccountToken, in.AutomountServiceAccountToken)
	same("topologySpreadConstraints", pg.TopologySpreadConstraints, in.TopologySpreadConstraints)
	same("init containers", pg.InitContainers, slices.DeleteFunc(slices.Clone(in.InitContainers), func(c corev1.Container) bool { return c.Name == "trace-layout" }))
	same("container signer", container(t, pg, signerContainer), container(t, in, signerContainer))
	a, b := container(t, pg, serverContainer), container(t, in, serverContainer)
	keys := flagValue(b.Args, "--ingest-keys")
	same("server args", append(slices.Clone(a.Args), "--ingest", "--ingest-keys", keys), b.Args)
	same("server image", a.Image, b.Image)
	same("server env", a.Env, b.Env)
	same("server ports", a.Ports, b.Ports)
	same("server liveness and readiness", []*corev1.Probe{a.LivenessProbe, a.ReadinessProbe}, []*corev1.Probe{b.LivenessProbe, b.ReadinessProbe})
	if a.StartupProbe == nil || b.StartupProbe == nil || !reflect.DeepEqual(a.StartupProbe.ProbeHandler, b.StartupProbe.ProbeHandler) ||
		b.StartupProbe.FailureThreshold*b.StartupProbe.PeriodSeconds < a.StartupProbe.FailureThreshold*a.StartupProbe.PeriodSeconds {
		t.Errorf("server startupProbe %+v: want the PostgreSQL one's (%+v) with no shorter a budget", b.StartupProbe, a.StartupProbe)
	}
	same("server securityContext", a.SecurityContext, b.SecurityContext)
	same("server resources", a.Resources, b.Resources)
	// The volumes and mounts, less the Trace root and the keys.
	dir := flagValue(b.Args, "--dir")
	otherMounts := func(c corev1.Container) []corev1.VolumeMount {
		return slices.DeleteFunc(slices.Clone(c.VolumeMounts), func(m corev1.VolumeMount) bool {
			return m.MountPath == dir || m.MountPath == filepath.Dir(keys)
		})
	}
	same("server's other mounts", otherMounts(a), otherMounts(b))
	otherVolumes := func(p *corev1.PodSpec) []corev1.Volume {
		return slices.DeleteFunc(slices.Clone(p.Volumes), func(v corev1.Volume) bool {
			return v.Name == "trace-root" || (v.Secret != nil && v.Secret.SecretName == ingestKeysSecretName)
		})
	}
	same("other volumes", otherVolumes(pg), otherVolumes(in))
}

// TestComposeHardeningAnchorsAgree: every compose file's x-hardening, which
// its header says is compose.yaml's, is.
func TestComposeHardeningAnchorsAgree(t *testing.T) {
	var first map[string]any
	for _, v := range composeVariants() {
		var h map[string]any
		if err := loadComposeFile(t, v.file).XHardening.Decode(&h); err != nil || len(h) == 0 {
			t.Fatalf("%s: x-hardening: %v (%d keys)", v.file, err, len(h))
		}
		if first == nil {
			first = h
			continue
		}
		if !reflect.DeepEqual(first, h) {
			t.Errorf("%s's x-hardening differs from %s's:\n%v\n%v", v.file, composeVariants()[0].file, h, first)
		}
	}
}
