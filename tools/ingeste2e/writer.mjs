// A recorder of Haia Trace core (the sources of packages/core/src, run
// unmodified) that records an x402 buyer's run to its own run file and,
// through the Control Plane writer, to a haia-trace-mcp --ingest server.
//
// usage: node --import ./register.mjs writer.mjs CORE_SRC URL KEY RUN_DIR RUN_ID EVENTS BATCH_SIZE MAX_RETRIES PAUSE_MS
//
// It records EVENTS events, four an operation, flushing every BATCH_SIZE
// and pausing PAUSE_MS between flushes (so a test can kill the server
// mid-run), then flushes and prints one JSON line: the run file's path,
// and every fault the writers reported.
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [core, url, apiKey, runDir, runId, count, batchSize, maxRetries, pauseMs] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(join(core, p)).href);
const { createRecorder, createMulticastEventWriter } = await load("index.ts");
const { createRunEventWriter } = await load("sink/file.ts");
const { createCpEventWriter } = await load("sink/cp.ts");

const errors = [];
const onError = (err) => errors.push(String(err?.message ?? err));
const cp = createCpEventWriter({
  url,
  apiKey,
  agentId: "agent-e2e",
  runId,
  batchSize: Number(batchSize),
  maxRetries: Number(maxRetries),
  flushIntervalMs: 60_000,
  onError,
});
const file = createRunEventWriter(runDir, { now: () => Number(runId), onError });
const recorder = createRecorder({ adapter: "trace-x402", writer: createMulticastEventWriter(file, cp) });

const seller = (op) => `0x${(op % 7 + 1).toString(16).padStart(40, "b")}`;
const stages = ["x402.payment.required", "x402.payment.creating", "x402.payment.submitted", "x402.payment.responded"];
const n = Number(count);
for (let i = 0; i < n; i++) {
  const op = Math.floor(i / 4);
  const stage = i % 4;
  const requirements = { scheme: "exact", network: "base", amount: String(10000 * (op % 5 + 1)), asset: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", pay_to: seller(op), max_timeout_seconds: 300 };
  const payload = { x402_version: 2, resource: { url: `https://seller-${op % 7}.example.com/item/${op}`, description: "Paid \"resource\" — é ✓ \u2028", mime_type: "application/json" } };
  if (stage === 0) payload.accepts = [requirements];
  else payload.requirements = requirements;
  if (stage === 3) payload.settle = { success: op % 3 !== 0, transaction: `0x${op.toString(16).padStart(64, "0")}`, network: "base", ratio: 0.1 + op };
  recorder.record({ event_type: stages[stage], role: "client", context_id: `op-${op}`, payload });
  if ((i + 1) % Number(batchSize) === 0) {
    await cp.flush();
    if (Number(pauseMs) > 0) await new Promise((r) => setTimeout(r, Number(pauseMs)));
  }
}
await cp.flush();
process.stdout.write(JSON.stringify({ path: file.path, errors }) + "\n");
