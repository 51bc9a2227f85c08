// A real OAuth 2.1 authorization server for the tests: oidc-provider (npm) with PKCE required,
// refresh-token rotation, resource indicators (JWT access tokens whose audience is the MCP
// server), dynamic client registration, revocation, client credentials and devInteractions
// (login and consent pages a test drives over HTTP), and Client ID Metadata Documents.
//
//   node oidc_provider.mjs <port> <accessTokenSeconds>   (CLIENTS: JSON list of static clients)
//
// ACCOUNTS (JSON, optional): login -> extra claims of that account (e.g. {"alice": {"groups":
// ["ops"]}}); with it, ID tokens carry the claims of the scopes asked for (`groups` under the
// scope `groups`, `name` under `profile`), as a sign-in with a groups claim needs.
//
// Prints "ready <issuer>" when it listens. GET /__stats answers the token requests it served
// by grant type and outcome (a test counts refreshes there); POST /__revoke-grants revokes every
// grant (all refresh tokens), as a user revoking toolbus's access at the provider would.
import http from 'node:http';
import { pathToFileURL } from 'node:url';
import path from 'node:path';

// NODE_MODULES: the node_modules folder holding oidc-provider (an ES module: NODE_PATH is not read).
const { default: Provider } = await import(
  pathToFileURL(path.join(process.env.NODE_MODULES, 'oidc-provider', 'lib', 'index.js')).href
);

const port = Number(process.argv[2]);
const ttl = Number(process.argv[3] || 5);
const issuer = `http://127.0.0.1:${port}`;
const clients = JSON.parse(process.env.CLIENTS || '[]');
const accounts = JSON.parse(process.env.ACCOUNTS || 'null');
const withAccounts = accounts ? {
  findAccount: (ctx, id) => ({
    accountId: id,
    claims: () => ({ sub: id, name: id, ...(accounts[id] || {}) }),
  }),
  claims: { openid: ['sub'], profile: ['name'], groups: ['groups'] },
  conformIdTokenClaims: false,
} : {};
const stats = {};
const grants = new Set();
const count = (key) => { stats[key] = (stats[key] || 0) + 1; };

const provider = new Provider(issuer, {
  clients,
  ...withAccounts,
  scopes: ['openid', 'offline_access', 'tools:read', 'tools:write', 'tools:admin', ...(accounts ? ['profile', 'groups'] : [])],
  features: {
    devInteractions: { enabled: true },
    registration: { enabled: true },
    revocation: { enabled: true },
    clientCredentials: { enabled: true },
    // Client ID Metadata Documents: an https client_id is fetched (below) and validated by
    // oidc-provider itself (same client_id, no secret, https client_id).
    clientIdMetadataDocument: { enabled: true, ack: 'draft-02' },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => undefined,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resource) => ({
        scope: 'tools:read tools:write tools:admin',
        audience: resource,
        accessTokenFormat: 'jwt',
        accessTokenTTL: ttl,
      }),
    },
  },
  pkce: { required: () => true },
  // oidc-provider refuses to fetch from special-use addresses (SSRF protection); the tests' toolbus
  // listens on loopback, so the fetch goes without that check. A TLS certificate of the test's is
  // trusted through NODE_EXTRA_CA_CERTS. Each fetch is counted (`cimd:<status>`).
  fetch: async (url, options) => {
    delete options.dispatcher;
    const response = await globalThis.fetch(url, options);
    count(`cimd:${response.status}`);
    return response;
  },
  rotateRefreshToken: true,
  issueRefreshToken: (ctx, client, code) =>
    client.grantTypeAllowed('refresh_token') && code.scopes.has('offline_access'),
  // Codes live 10 minutes (60 seconds by default): a test may restart toolbus between the
  // consent and the redirect's landing.
  ttl: {
    AccessToken: ttl, AuthorizationCode: 600, ClientCredentials: ttl, RefreshToken: 3600, Grant: 3600, Session: 3600,
  },
  loadExistingGrant: async (ctx) => {
    // Only the grant of this authorization's own consent: every authorization asks for consent
    // again (the test drives it), so a step-up's larger scope is granted only when consented to.
    const grantId = ctx.oidc.result?.consent?.grantId;
    return grantId ? ctx.oidc.provider.Grant.find(grantId) : undefined;
  },
});
provider.proxy = false;
provider.on('grant.success', (ctx) => count(`${ctx.oidc.params.grant_type}:ok`));
provider.on('grant.error', (ctx) => count(`${ctx.oidc.params?.grant_type}:error`));
provider.on('grant.saved', (grant) => grants.add(grant.jti));

const callback = provider.callback();
const server = http.createServer(async (req, res) => {
  if (req.url === '/__stats') {
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify(stats));
    return;
  }
  if (req.url === '/__revoke-grants' && req.method === 'POST') {
    for (const jti of grants) {
      const grant = await provider.Grant.find(jti);
      if (grant) await grant.destroy();
      await provider.RefreshToken.revokeByGrantId(jti);
      await provider.AccessToken.revokeByGrantId(jti);
    }
    grants.clear();
    res.end('revoked');
    return;
  }
  if (req.url.startsWith('/token/revocation')) {
    res.on('finish', () => count(`revocation:${res.statusCode}`));
  }
  callback(req, res);
});
server.listen(port, '127.0.0.1', () => console.log(`ready ${issuer}`));
