package deploy

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
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
