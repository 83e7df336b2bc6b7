package main

import (
	"flag"
	"time"
)

// The flags several commands take, declared once each with one help text.
// A command with a flag of the same name but another meaning declares its
// own: store import/export's --dir (required: the root to copy from or
// to), verify's --store and --keyring (the NOA verifier's, with no Trace
// root behind them), reviewer init's --key-file (the reviewer's key, not
// the server's), build's --templates-dir (no Trace root either), and the
// few TestSharedFlagsHaveOneHelpText lists.

// dirFlag is --dir, the Trace root a command reads or serves.
func dirFlag(fs *flag.FlagSet) *string {
	p := new(string)
	dirFlagVar(fs, p)
	return p
}

// dirFlagVar is dirFlag into p.
func dirFlagVar(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "dir", ".trace", "the Trace root `DIR` (events/, templates/, guard/)")
}

// storeFlagHelp is --store's help.
const storeFlagHelp = "where the guard's state lives: `URL` file: (the Trace root's guard/, the default) or postgres://user@host/db (default: $" + storeEnv + ")"

// storeFlag is --store, the guard's store (see storeSpec).
func storeFlag(fs *flag.FlagSet) *string { return fs.String("store", "", storeFlagHelp) }

// storeFlagVar is storeFlag into p.
func storeFlagVar(fs *flag.FlagSet, p *string) { fs.StringVar(p, "store", "", storeFlagHelp) }

const reviewersFlagHelp = "the trusted reviewers `FILE`: the reviewers' public keys and passkeys (default: reviewers.json in the user configuration directory); only reviewer init and reviewer passkey write it"

// reviewersFlag is --reviewers, the trusted reviewers file.
func reviewersFlag(fs *flag.FlagSet) *string { return fs.String("reviewers", "", reviewersFlagHelp) }

// reviewersFlagVar is reviewersFlag into p.
func reviewersFlagVar(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "reviewers", "", reviewersFlagHelp)
}

const guardConfigFlagHelp = "the guard policy `FILE`. The server puts it in force, re-reads it on SIGHUP and records it in the store (default: haia-guard.config.json beside --dir when it exists, else the built-in defaults); " +
	"the other commands go by the policy recorded there when there is one and refuse a --guard-config that is not it (status reports a problem)"

// guardConfigFlag is --guard-config, the guard policy file.
func guardConfigFlag(fs *flag.FlagSet) *string {
	return fs.String("guard-config", "", guardConfigFlagHelp)
}

// guardConfigFlagVar is guardConfigFlag into p.
func guardConfigFlagVar(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "guard-config", "", guardConfigFlagHelp)
}

const templatesDirFlagHelp = "the operator's templates `DIR`, searched before the bundled templates (default: the Trace root's templates/)"

// templatesDirFlagVar is --templates-dir into p, for a command with a
// Trace root.
func templatesDirFlagVar(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "templates-dir", "", templatesDirFlagHelp)
}

const tenantsDirFlagHelp = "the directory of the tenants' Trace roots, `DIR`/<tenant>/ each: the server serves them over --http (the token's --tenant-claim names the tenant); the review commands act on --tenant's"

// tenantsDirFlagVar is --tenants-dir into p.
func tenantsDirFlagVar(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "tenants-dir", "", tenantsDirFlagHelp)
}

const tenantFlagHelp = "with --tenants-dir: the tenant `NAME` whose Trace root DIR/NAME is read, as the server serving those tenants reads it (only the reviewers the trusted reviewers file grants NAME decide there); a tenant's root given as --dir is read the same way, by the tenant its server recorded"

// tenantFlagVar is --tenant into p, with --tenants-dir.
func tenantFlagVar(fs *flag.FlagSet, p *string) { fs.StringVar(p, "tenant", "", tenantFlagHelp) }

// jsonFlag is --json.
func jsonFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("json", false, "print JSON instead of text")
}

// keyringFlag is --keyring for the commands that read a store: the keys to
// verify the signed receipts against instead of the store's.
func keyringFlag(fs *flag.FlagSet) *string {
	return fs.String("keyring", "", "verify the signed receipts against the keys of this keyring `FILE` ({kid: base64 SPKI}) only (default: the keyring the store holds, guard/keyring.json for files)")
}

// keyFileFlagHelp is the server's --key-file, which init creates.
const keyFileFlagHelp = "the Ed25519 signing key `FILE` for decision receipts (PKCS#8 PEM, mode 0600; created when absent)\n(default: $HAIA_CONFIG_DIR/signing-key.pem, else $XDG_CONFIG_HOME/haia-trace-mcp/signing-key.pem; never the Trace root)"

// reviewerKeyFlag is --reviewer-key, the key a reviewer signs decisions
// with.
func reviewerKeyFlag(fs *flag.FlagSet) *string {
	return fs.String("reviewer-key", "", "the reviewer's signing key `FILE` (default: reviewer-key.pem in the user configuration directory)")
}

// lockWaitFlag is --lock-wait, how long a writer waits for the review
// log's lock.
func lockWaitFlag(fs *flag.FlagSet) *time.Duration {
	return fs.Duration("lock-wait", 5*time.Second, "how long to wait for the review log's lock")
}
