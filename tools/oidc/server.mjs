// A loopback OAuth 2.1 authorization server for haia-trace-mcp's end-to-end
// test: oidc-provider with client credentials and resource indicators, so
// that it issues JWT access tokens whose `aud` is the resource asked for.
// It signs with a fresh P-256 key and writes the public JWKS to a file, which
// is all the resource server ever learns about it (no network call).
//
//   node server.mjs --jwks-out FILE [--client-id ID --client-secret S --scopes "a b"]
//
// When listening it prints one JSON line on stdout: {"issuer": "...", "token_endpoint": "..."}.
import { createServer } from 'node:http';
import { generateKeyPairSync, randomUUID } from 'node:crypto';
import { writeFileSync, renameSync } from 'node:fs';
import { parseArgs } from 'node:util';
import Provider from 'oidc-provider';

const { values: opt } = parseArgs({
  options: {
    'jwks-out': { type: 'string' },
    'client-id': { type: 'string', default: 'haia-agent' },
    'client-secret': { type: 'string', default: 'haia-agent-secret-for-tests-only' },
    scopes: { type: 'string', default: 'trace:read trace:guard' },
  },
});
if (!opt['jwks-out']) {
  console.error('usage: node server.mjs --jwks-out FILE');
  process.exit(2);
}

const kid = `as-${randomUUID()}`;
const { privateKey, publicKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
const privateJwk = { ...privateKey.export({ format: 'jwk' }), kid, alg: 'ES256', use: 'sig' };
const publicJwk = { ...publicKey.export({ format: 'jwk' }), kid, alg: 'ES256', use: 'sig' };
const tmp = `${opt['jwks-out']}.tmp`;
writeFileSync(tmp, JSON.stringify({ keys: [publicJwk] }, null, 2));
renameSync(tmp, opt['jwks-out']);

const http = createServer();
http.listen(0, '127.0.0.1', () => {
  const { port } = http.address();
  const issuer = `http://127.0.0.1:${port}`;
  const provider = new Provider(issuer, {
    jwks: { keys: [privateJwk] },
    clients: [{
      client_id: opt['client-id'],
      client_secret: opt['client-secret'],
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
      token_endpoint_auth_method: 'client_secret_post',
      id_token_signed_response_alg: 'ES256', // the only key is P-256
      scope: opt.scopes,
    }],
    scopes: opt.scopes.split(' '),
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        // Any loopback resource may be asked for, so the test can also
        // obtain a token for another resource and see it refused.
        getResourceServerInfo: (_ctx, resource) => {
          if (!/^http:\/\/127\.0\.0\.1:\d+\//.test(resource)) {
            throw new Error(`resource ${resource} is not a loopback URL`);
          }
          return {
            scope: opt.scopes,
            audience: resource,
            accessTokenTTL: 600,
            accessTokenFormat: 'jwt',
            jwt: { sign: { alg: 'ES256' } },
          };
        },
      },
    },
  });
  http.on('request', provider.callback());
  process.stdout.write(`${JSON.stringify({ issuer, token_endpoint: `${issuer}/token` })}\n`);
});

for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => http.close(() => process.exit(0)));
}
