// The x402 end-to-end harness of haia-trace-mcp. It starts, in this one
// process and on loopback only:
//   - a local EVM chain (ganache, in memory, chain id 1337);
//   - the EIP-3009 token of testdata/x402/HaiaTestUSD.sol, compiled with
//     solc and deployed there, with HAIA_X402_MINT atomic units minted to the
//     payer HAIA_X402_PAYER;
//   - the official x402 facilitator logic (@x402/core's x402Facilitator with
//     @x402/evm's exact scheme) verifying and settling on that chain;
//   - a seller answering GET /data with 402 through @x402/core's
//     x402HTTPResourceServer and @x402/evm's exact server scheme, and
//     serving the data once a payment settles;
//   - /control/* endpoints the Go test reads the chain through (balances,
//     a direct on-chain submission, the chain's clock, viem's recovery of a
//     typed-data signature);
//   - /rpc, the chain's JSON-RPC over HTTP, as a node serves it.
// It prints one JSON line with what the test needs, then serves until
// stdin closes.
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import { fileURLToPath } from "node:url";
import path from "node:path";
import ganache from "ganache";
import solc from "solc";
import {
  createPublicClient, createWalletClient, custom, defineChain, encodeFunctionData, getAddress, parseSignature,
  recoverTypedDataAddress, publicActions,
} from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { x402Facilitator } from "@x402/core/facilitator";
import { x402ResourceServer, x402HTTPResourceServer } from "@x402/core/server";
import { toFacilitatorEvmSigner } from "@x402/evm";
import { ExactEvmScheme as ExactEvmFacilitator } from "@x402/evm/exact/facilitator";
import { ExactEvmScheme as ExactEvmServer } from "@x402/evm/exact/server";
import {
  createOfferReceiptExtension, createEIP712OfferReceiptIssuer, createJWSOfferReceiptIssuer, declareOfferReceiptExtension,
  verifyOfferSignatureEIP712, verifyOfferSignatureJWS, verifyReceiptSignatureEIP712, verifyReceiptSignatureJWS,
} from "@x402/extensions/offer-receipt";
import { generateKeyPairSync, sign as cryptoSign } from "node:crypto";

const here = path.dirname(fileURLToPath(import.meta.url));
const CHAIN_ID = 1337;
const NETWORK = `eip155:${CHAIN_ID}`;
const TOKEN_NAME = "Haia Test USD";
const TOKEN_VERSION = "2";
const PRICE = process.env.HAIA_X402_PRICE || "250000";
const payer = getAddress(process.env.HAIA_X402_PAYER);
const mint = BigInt(process.env.HAIA_X402_MINT || "10000000");

// The chain.
const provider = ganache.provider({
  chain: { chainId: CHAIN_ID, hardfork: "shanghai" },
  wallet: { deterministic: true, totalAccounts: 3 },
  logging: { quiet: true },
});
const accounts = Object.values(await provider.getInitialAccounts());
const [facilitatorAccount, sellerAccount, deniedAccount] = accounts.map(a => privateKeyToAccount(a.secretKey));
const chain = defineChain({
  id: CHAIN_ID, name: "haia-local", nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
  rpcUrls: { default: { http: ["http://127.0.0.1"] } },
});
const transport = custom(provider);
const publicClient = createPublicClient({ chain, transport });
const wallet = createWalletClient({ account: facilitatorAccount, chain, transport }).extend(publicActions);

// The token, compiled from source.
const source = readFileSync(path.join(here, "..", "..", "testdata", "x402", "HaiaTestUSD.sol"), "utf8");
const compiled = JSON.parse(solc.compile(JSON.stringify({
  language: "Solidity",
  sources: { "HaiaTestUSD.sol": { content: source } },
  settings: { evmVersion: "shanghai", optimizer: { enabled: true, runs: 200 }, outputSelection: { "*": { "*": ["abi", "evm.bytecode.object"] } } },
})));
const errors = (compiled.errors || []).filter(e => e.severity === "error");
if (errors.length > 0) {
  console.error(errors.map(e => e.formattedMessage).join("\n"));
  process.exit(1);
}
const artifact = compiled.contracts["HaiaTestUSD.sol"].HaiaTestUSD;
const abi = artifact.abi;
const deployHash = await wallet.deployContract({ abi, bytecode: `0x${artifact.evm.bytecode.object}`, args: [TOKEN_NAME, TOKEN_VERSION] });
const token = getAddress((await publicClient.waitForTransactionReceipt({ hash: deployHash })).contractAddress);
await publicClient.waitForTransactionReceipt({ hash: await wallet.writeContract({ address: token, abi, functionName: "mint", args: [payer, mint] }) });

// The facilitator: the official logic, settling from account 0.
const facilitatorSigner = toFacilitatorEvmSigner({
  address: facilitatorAccount.address,
  getCode: args => wallet.getCode(args),
  readContract: args => wallet.readContract({ ...args, args: args.args || [] }),
  verifyTypedData: args => wallet.verifyTypedData(args),
  writeContract: args => wallet.writeContract({ ...args, args: args.args || [] }),
  sendTransaction: args => wallet.sendTransaction(args),
  waitForTransactionReceipt: args => wallet.waitForTransactionReceipt(args),
});
const facilitator = new x402Facilitator().register(NETWORK, new ExactEvmFacilitator(facilitatorSigner));
const localFacilitator = {
  verify: (p, r) => facilitator.verify(p, r),
  settle: (p, r) => facilitator.settle(p, r),
  getSupported: async () => facilitator.getSupported(),
};

// The seller.
const resourceServer = new x402ResourceServer(localFacilitator).register(NETWORK, new ExactEvmServer());
const route = (payTo, amount) => ({
  accepts: {
    scheme: "exact", network: NETWORK, payTo, maxTimeoutSeconds: 300,
    price: { amount, asset: token, extra: { name: TOKEN_NAME, version: TOKEN_VERSION } },
  },
  description: "Paid data", mimeType: "application/json",
});
// /data costs PRICE, /big ten times more, /denied pays another seller.
const routes = {
  "GET /data": route(sellerAccount.address, PRICE),
  "GET /big": route(sellerAccount.address, (BigInt(PRICE) * 10n).toString()),
  "GET /denied": route(deniedAccount.address, PRICE),
};
const httpServer = new x402HTTPResourceServer(resourceServer, routes);
await httpServer.initialize();

// Sellers that sign their offers and receipts with @x402/extensions'
// offer-receipt issuers: EIP-712 by the payee's own key (/offer712), and a
// JWS (ES256, a P-256 key named by its did:jwk identifier) (/offerjws).
const { privateKey: jwsKey, publicKey: jwsPub } = generateKeyPairSync("ec", { namedCurve: "P-256" });
const jwk = jwsPub.export({ format: "jwk" });
const jwsKid = "did:jwk:" + Buffer.from(JSON.stringify({ kty: "EC", crv: "P-256", x: jwk.x, y: jwk.y })).toString("base64url") + "#0";
const jwsIssuer = createJWSOfferReceiptIssuer(jwsKid, {
  kid: jwsKid, format: "jws", algorithm: "ES256",
  sign: async bytes => cryptoSign("sha256", bytes, { key: jwsKey, dsaEncoding: "ieee-p1363" }).toString("base64url"),
});
const eip712Issuer = createEIP712OfferReceiptIssuer(`did:pkh:eip155:1:${sellerAccount.address}`, args => sellerAccount.signTypedData(args));
const signedRoute = (payTo, amount) => ({ ...route(payTo, amount), extensions: { ...declareOfferReceiptExtension({ includeTxHash: true, offerValiditySeconds: 600 }) } });
const offerServers = {};
for (const [name, issuer] of [["offer712", eip712Issuer], ["offerjws", jwsIssuer]]) {
  const rs = new x402ResourceServer(localFacilitator).register(NETWORK, new ExactEvmServer()).registerExtension(createOfferReceiptExtension(issuer));
  const hs = new x402HTTPResourceServer(rs, { [`GET /${name}`]: signedRoute(sellerAccount.address, PRICE) });
  await hs.initialize();
  offerServers[`/${name}`] = hs;
}

const stats = { required: 0, settled: 0, refused: 0 };

function adapter(req, url) {
  return {
    getHeader: name => {
      const v = req.headers[name.toLowerCase()];
      return Array.isArray(v) ? v[0] : v;
    },
    getMethod: () => req.method,
    getPath: () => url.pathname,
    getUrl: () => url.toString(),
    getAcceptHeader: () => req.headers.accept || "",
    getUserAgent: () => req.headers["user-agent"] || "",
  };
}

function send(res, status, headers, body) {
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(typeof body === "string" ? body : JSON.stringify(body ?? {}));
}

async function readJSON(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  return JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}");
}

async function paid(req, res, url) {
  const a = adapter(req, url);
  const context = { adapter: a, path: url.pathname, method: req.method,
    paymentHeader: a.getHeader("payment-signature") || a.getHeader("x-payment") };
  const hs = offerServers[url.pathname] || httpServer;
  const result = await hs.processHTTPRequest(context);
  if (result.type === "payment-error") {
    if (context.paymentHeader) stats.refused++; else stats.required++;
    return send(res, result.response.status, result.response.headers, result.response.body);
  }
  if (result.type !== "payment-verified") {
    return send(res, 500, {}, { error: "the route should require a payment" });
  }
  const settled = await hs.processSettlement(result.paymentPayload, result.paymentRequirements, result.declaredExtensions,
    { request: context });
  if (!settled.success) {
    stats.refused++;
    return send(res, 402, settled.headers || {}, { error: settled.errorReason || "settlement failed", detail: settled.errorMessage });
  }
  stats.settled++;
  return send(res, 200, settled.headers, { data: "the paid data", transaction: settled.transaction });
}

async function control(req, res, url) {
  const body = req.method === "POST" ? await readJSON(req) : {};
  switch (url.pathname) {
    case "/control/balance": {
      const v = await publicClient.readContract({ address: token, abi, functionName: "balanceOf", args: [getAddress(body.address)] });
      return send(res, 200, {}, { balance: v.toString() });
    }
    case "/control/used": {
      const v = await publicClient.readContract({ address: token, abi, functionName: "authorizationState", args: [getAddress(body.from), body.nonce] });
      return send(res, 200, {}, { used: v });
    }
    case "/control/advance": {
      await provider.request({ method: "evm_increaseTime", params: [Number(body.seconds)] });
      await provider.request({ method: "evm_mine", params: [] });
      return send(res, 200, {}, { ok: true });
    }
    case "/control/submit": {
      // Submit a PaymentPayload's authorization straight to the token, as
      // anyone holding the header could: the chain is the last word.
      const p = body.payload.payload;
      const sig = parseSignature(p.signature);
      const au = p.authorization;
      const call = {
        address: token, abi, functionName: "transferWithAuthorization", account: facilitatorAccount,
        args: [au.from, au.to, BigInt(au.value), BigInt(au.validAfter), BigInt(au.validBefore), au.nonce, Number(sig.v ?? 27n + BigInt(sig.yParity)), sig.r, sig.s],
      };
      // The revert reason, read by a call against the chain's state...
      let reason = "";
      try {
        await provider.request({ method: "eth_call", params: [{ from: facilitatorAccount.address, to: token, data: encodeFunctionData(call) }, "latest"] });
      } catch (e) {
        reason = String(e.message).split("\n")[0];
      }
      // ...and the transaction itself, mined whatever the call said.
      const hash = await wallet.writeContract({ ...call, gas: 300000n });
      const receipt = await publicClient.waitForTransactionReceipt({ hash });
      return send(res, 200, {}, { ok: receipt.status === "success", status: receipt.status, error: reason });
    }
    case "/control/recover": {
      // viem's reading of a typed-data signature: who signed it.
      const au = body.authorization;
      const address = await recoverTypedDataAddress({
        domain: { name: body.domain.name, version: body.domain.version, chainId: Number(body.domain.chainId), verifyingContract: body.domain.verifyingContract },
        types: { TransferWithAuthorization: [
          { name: "from", type: "address" }, { name: "to", type: "address" }, { name: "value", type: "uint256" },
          { name: "validAfter", type: "uint256" }, { name: "validBefore", type: "uint256" }, { name: "nonce", type: "bytes32" }] },
        primaryType: "TransferWithAuthorization",
        message: { from: au.from, to: au.to, value: BigInt(au.value), validAfter: BigInt(au.validAfter), validBefore: BigInt(au.validBefore), nonce: au.nonce },
        signature: body.signature,
      });
      return send(res, 200, {}, { address });
    }
    case "/control/verify-artifact": {
      // The official package's own verification of a signed offer or
      // receipt: the signer (EIP-712) or the key from its kid (JWS), and
      // the payload it signs.
      try {
        const a = body.artifact;
        let out;
        if (body.kind === "offer") {
          out = a.format === "jws" ? { payload: await verifyOfferSignatureJWS(a) } : await verifyOfferSignatureEIP712(a);
        } else {
          out = a.format === "jws" ? { payload: await verifyReceiptSignatureJWS(a) } : await verifyReceiptSignatureEIP712(a);
        }
        return send(res, 200, {}, { ok: true, signer: out.signer || "", payload: out.payload });
      } catch (e) {
        return send(res, 200, {}, { ok: false, error: String(e.message || e) });
      }
    }
    case "/control/stats":
      return send(res, 200, {}, stats);
  }
  return send(res, 404, {}, { error: "no such control" });
}

// The chain's JSON-RPC, as a node serves it over HTTP: what the product
// reads through --chain-rpc (eth_chainId, eth_getBlockByNumber, eth_call).
async function rpc(req, res) {
  const body = await readJSON(req);
  try {
    const result = await provider.request({ method: body.method, params: body.params || [] });
    return send(res, 200, {}, { jsonrpc: "2.0", id: body.id, result });
  } catch (e) {
    return send(res, 200, {}, { jsonrpc: "2.0", id: body.id, error: { code: e.code ?? -32000, message: String(e.message || e) } });
  }
}

const server = createServer((req, res) => {
  const url = new URL(req.url, `http://${req.headers.host}`);
  const handler = url.pathname === "/rpc" ? rpc : url.pathname.startsWith("/control/") ? control : paid;
  handler(req, res, url).catch(e => send(res, 500, {}, { error: String(e.message || e) }));
});
server.listen(0, "127.0.0.1", () => {
  const { port } = server.address();
  console.log(JSON.stringify({
    url: `http://127.0.0.1:${port}`, network: NETWORK, chain_id: CHAIN_ID, token, token_name: TOKEN_NAME, token_version: TOKEN_VERSION,
    seller: sellerAccount.address, denied: deniedAccount.address, facilitator: facilitatorAccount.address, payer, price: PRICE, jws_kid: jwsKid,
  }));
});
process.stdin.resume();
process.stdin.on("end", () => { server.close(); process.exit(0); });
