package main

import (
	"context"
	"flag"
	"strings"
)

// commandTable is the whole command line: serving MCP (the command with no
// name) and every command under it, in the order the top-level help lists
// them. run dispatches through it; --help, usage errors and the completion
// scripts are generated from it.
func commandTable() *cmdSpec {
	return &cmdSpec{
		summary:  "serve MCP over stdio (Streamable HTTP with --http)",
		synopsis: "[--dir .trace] [flags]",
		args:     argSpec{max: -1},
		define:   defineServe,
		subs: []*cmdSpec{
			{name: "build", summary: "assemble one run file against a template, as the reference assembler does",
				synopsis: "RUN_FILE [--template NAME|PATH] [--templates-dir DIR]", details: buildDetails,
				args: oneArg("one RUN_FILE"), define: defineBuild},
			{name: "template", summary: "the operation templates: what a recorder must write for each", details: templateDetails, subs: []*cmdSpec{
				{name: "show", summary: "a template's stages in order, the fields each needs, and an example run that builds full",
					synopsis: "NAME|PATH [--dir .trace] [--templates-dir DIR] [--json]", args: oneArg("one template NAME or PATH"), define: defineTemplateShow},
			}},
			{name: "policy", summary: "check a guard policy or a noa.policy/0.2 rule file; evaluate a rule file; try a policy on history", details: policyDetails, subs: []*cmdSpec{
				{name: "check", summary: "validate a guard policy or a rule file with the server's loader: what it sets, or every problem with its path and line",
					synopsis: "FILE [--dir .trace] [--json]", args: oneArg("exactly one FILE"), define: definePolicyCheck},
				{name: "eval", summary: "evaluate a policy over an input snapshot; print the verdict and the rule that fired",
					synopsis: "FILE --input INPUT.json", args: oneArg("exactly one FILE"), define: definePolicyEval},
				{name: "simulate", summary: "try a candidate guard policy on history: replay every recorded question and print the decisions that would change",
					synopsis: "--guard-config NEW.json [--since 30d] [--dir .trace] [--store URL] [--json]", details: policySimulateDetails, define: definePolicySimulate},
			}},
			{name: "verify", summary: "verify a NOA receipt v0.1 chain offline (or every segment of a chain in a store)",
				synopsis: "CHAIN [KEYRING] [--keyring K] [--checkpoint C] [--identity M] [--follow] [--store URL]",
				details:  verifyDetails, usageCode: exitVerifyUsage,
				args: argSpec{min: 1, max: 2, what: "CHAIN and at most one KEYRING"}, define: defineVerify},
			{name: "signer", summary: "hold a signing key (or the x402 payer key) in a process of its own, signing over a unix socket",
				synopsis: "--key-file K --listen unix:PATH | --payer-key K --listen unix:PATH", details: signerDetails,
				define: defineSigner},
			{name: "payer", summary: "the x402 payer", subs: []*cmdSpec{
				{name: "address", summary: "print the address x402 payments are signed from (never the key)",
					synopsis: "--payer-key K [--payer-key-password-file P] | --payer-signer unix:PATH",
					define:   definePayerAddress},
			}},
			{name: "authorization", summary: "the x402 authorizations the guard signed", details: authorizationDetails, subs: []*cmdSpec{
				{name: "show", summary: "one authorization, checked against the signed receipts",
					synopsis: "NONCE|RECEIPT_ID [--dir .trace] [--json]",
					args:     oneArg("one nonce (0x and 64 hex digits) or receipt id"), define: defineAuthorizationShow},
			}},
			{name: "dossier", summary: "one x402 payment's evidence in one file anyone can verify offline", details: dossierDetails, subs: []*cmdSpec{
				{name: "export", summary: "write the decision, human decision, authorization, seller's offer and receipt, settlement and chain segments of one payment",
					synopsis: "NONCE|RECEIPT_ID|RUN_ID/OPERATION_ID [--dir .trace] [--out FILE]",
					args:     oneArg("one nonce, receipt id or RUN_ID/OPERATION_ID"), define: defineDossierExport},
				{name: "verify", summary: "check every signature and link of a dossier offline; print each link's verdict",
					synopsis: "FILE [--keyring K] [--reviewers R] [--json]", usageCode: exitVerifyUsage,
					args: oneArg("one dossier FILE"), define: defineDossierVerify},
			}},
			{name: "review", summary: "the human's side of the guard: list, show and decide reviews", details: reviewDetails, subs: []*cmdSpec{
				{name: "list", summary: "the pending reviews (--all: every review)",
					synopsis: "[--dir .trace] [--all] [--json]", define: defineReview("list")},
				{name: "show", summary: "one review: what it asks, as the server signed it, and its terms hash",
					synopsis: "<review_id> [--dir .trace] [--json]", args: oneArg("one review id"), define: defineReview("show")},
				{name: "approve", summary: "approve a review, signed with the reviewer's own key",
					synopsis: `<review_id> [--note "…"] [--terms HASH] [--reviewer-key K]`, args: oneArg("one review id"), define: defineReview("approve")},
				{name: "reject", summary: "reject a review, signed with the reviewer's own key",
					synopsis: `<review_id> [--note "…"] [--terms HASH] [--reviewer-key K]`, args: oneArg("one review id"), define: defineReview("reject")},
				{name: "watch", summary: "print reviews as they open and are decided, until interrupted",
					synopsis: "[--dir .trace] [--json] [--interval 1s]", details: reviewWatchDetails, define: defineReviewWatch},
				{name: "archive", summary: "move final reviews older than --older-than out of the live log",
					synopsis: "[--older-than 2160h] [--dir .trace]", define: defineReview("archive")},
			}},
			{name: "mandate", summary: "standing approvals: a reviewer's signed bounds a payee may be paid within without review", details: mandateDetails, subs: []*cmdSpec{
				{name: "grant", summary: "sign a mandate with the reviewer's own key and print its id",
					synopsis: `--payee ADDR [--host HOST] --max-amount A --budget B [--count N] --expires DURATION [--agent ID] [--tenant T] [--note "…"] [--reviewer-key K]`,
					define:   defineMandate("grant")},
				{name: "list", summary: "every mandate: state, used and left, expiry, who signed",
					synopsis: "[--dir .trace] [--json]", define: defineMandate("list")},
				{name: "show", summary: "one mandate: its terms, what it used and has left, its signatures",
					synopsis: "<mandate_id> [--dir .trace] [--json]", args: oneArg("one mandate id"), define: defineMandate("show")},
				{name: "revoke", summary: "end a mandate, signed with the reviewer's own key (holds on every replica from the next question)",
					synopsis: "<mandate_id> [--reviewer-key K]", args: oneArg("one mandate id"), define: defineMandate("revoke")},
				{name: "sign", summary: "add another reviewer's signature to a mandate a quorum asks several for",
					synopsis: "<mandate_id> [--reviewer-key K]", args: oneArg("one mandate id"), define: defineMandate("sign")},
				{name: "import", summary: "sign an AP2 open payment mandate (mandate.payment.open.1) as the reviewer's own mandate",
					synopsis: "FILE [--reviewer-key K] [--tenant T]", args: oneArg("one AP2 mandate FILE"), define: defineMandate("import")},
			}},
			{name: "init", summary: "a Trace root from nothing: layout, keys, a reviewer, an example policy",
				synopsis: "[DIR]", details: initDetails, args: argSpec{max: 1, what: "at most one DIR"}, define: defineInit},
			{name: "reviewer", summary: "the trusted reviewers: keys and passkeys", details: reviewerDetails, subs: []*cmdSpec{
				{name: "init", summary: "create a reviewer's key and trust it",
					synopsis: "--id ID [--key-file K] [--reviewers F] [--tenant NAME]...", define: defineReviewerInit},
				{name: "passkey", summary: "a reviewer's passkeys for the console", details: reviewerPasskeyDetails, subs: []*cmdSpec{
					{name: "add", summary: "enrol a passkey through the console and trust it",
						synopsis: "--id ID [--console-url URL] [--tenant NAME]... [--yes] [--wait 10m]", define: defineReviewerPasskey("add")},
					{name: "remove", summary: "take a reviewer's passkeys (or one) out of the trusted reviewers file",
						synopsis: "--id ID [--credential CRED_ID]", define: defineReviewerPasskey("remove")},
				}},
			}},
			{name: "ingest-key", summary: "the keys recorders post their events with (serve --ingest)", details: ingestKeyDetails, subs: []*cmdSpec{
				{name: "create", summary: "make a key, print it once, keep only its hash",
					synopsis: "[--tenant NAME] [--ingest-keys FILE | --reviewers F]", define: defineIngestKeyCreate},
				{name: "list", summary: "the keys' ids, tenants and dates (never a key)",
					synopsis: "[--ingest-keys FILE | --reviewers F] [--json]", define: defineIngestKeyList},
				{name: "revoke", summary: "refuse a key from the server's next request on",
					synopsis: "ID [--ingest-keys FILE | --reviewers F]", args: oneArg("one key ID"), define: defineIngestKeyRevoke},
			}},
			{name: "audit", summary: "verify every decision chain and cross-check the review log against the signatures",
				synopsis: "[--dir .trace | --tenants-dir DIR --tenant NAME]", details: auditDetails, define: defineAudit},
			{name: "status", summary: "the state at a glance: runs, payments, reviews, reservations, chains, policy",
				synopsis: "[--dir .trace] [--json]", details: statusDetails, define: defineStatus},
			{name: "store", summary: "the PostgreSQL store: schema and copies to and from files", details: storeDetails, subs: []*cmdSpec{
				{name: "migrate", summary: "apply the schema migrations this binary carries",
					synopsis: "--store postgres://…", define: defineStore("migrate")},
				{name: "import", summary: "copy the file store into an empty PostgreSQL store, verifying every chain",
					synopsis: "--dir .trace --store postgres://…", define: defineStore("import")},
				{name: "export", summary: "write the PostgreSQL store out as the file layout",
					synopsis: "--store postgres://… --dir OUT", define: defineStore("export")},
			}},
			{name: "chain", summary: "the decision chains: list, export, checkpoint", details: chainDetails, subs: []*cmdSpec{
				{name: "list", summary: "one line a chain: id, path, receipts, head hash, segments",
					synopsis: "[--dir .trace]", define: defineChain("list")},
				{name: "export", summary: "a chain segment as a NOA JSON array (--all --out DIR: every segment)",
					synopsis: "ID [--all --out DIR] [--dir .trace]", args: oneArg("one chain ID"), define: defineChain("export")},
				{name: "checkpoint", summary: "a signed noa.checkpoint/0.1 for the head of a chain",
					synopsis: "ID [--key-file K | --signer unix:PATH] [--dir .trace]", args: oneArg("one chain ID"), define: defineChain("checkpoint")},
			}},
			{name: "proxy", summary: "serve another MCP server's tools through the pre-payment guard",
				synopsis: "--guard-map FILE [--dir .trace] [flags] -- UPSTREAM_COMMAND [ARGS…] | --upstream-url URL",
				details:  proxyDetails, dashTail: true, args: argSpec{max: 0, what: "the upstream command"}, define: defineProxy},
			{name: "healthcheck", summary: "probe a running server's /healthz (for a container HEALTHCHECK)",
				synopsis: "[--url http://127.0.0.1:3000/healthz] [--timeout 3s]", details: healthcheckDetails, define: defineHealthcheck},
			{name: "demo", summary: "the whole story on a simulated Trace root", synopsis: "[--keep DIR]",
				details: demoDetails, define: defineDemo},
			{name: "completion", summary: "a shell completion script", synopsis: "bash|zsh|fish",
				details:  "Prints a shell completion script, e.g. source <(haia-trace-mcp completion bash).\n",
				argWords: []string{"bash", "zsh", "fish"}, args: oneArg("one shell: bash, zsh or fish"), define: defineCompletion},
			{name: "version", summary: "the version, the VCS revision and the Go toolchain (also --version)",
				define: defineVersion},
			{name: "help", summary: "this text (also --help); help COMMAND… is that command's",
				synopsis: "[COMMAND [SUBCOMMAND]]", args: argSpec{max: -1}, define: defineHelp},
		},
	}
}

// defineHelp is `help [COMMAND…]`: the help of the command named, else the
// top-level one.
func defineHelp(*flag.FlagSet) runFunc {
	return func(_ context.Context, env *cmdEnv, pos []string) error {
		root := commandTable()
		if root.find(pos) == nil {
			return usageErrorf("no command %q", strings.Join(pos, " "))
		}
		writeHelp(env.stdout, root, pos)
		return nil
	}
}
