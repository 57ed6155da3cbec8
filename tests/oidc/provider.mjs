// A real OpenID Connect provider (the `oidc-provider` package) for the single sign-on tests.
//
//   node provider.mjs --port 0 --clients '[{"client_id":..,"client_secret":..,"redirect_uris":[..]}]'
//                     [--claims-in-id-token]
//
// Prints `listening <issuer>` once it answers. Anyone may sign in with any login (the
// development sign-in form); the login is the account's email. Each start makes a new signing
// key, so restarting on the same port rotates the provider's keys.
//
// Test-only controls, so tests can make the provider misbehave the way a broken or hostile one
// would:
//   POST /_test/account {"email", "email_verified", "groups"}   what that account's claims say
//   POST /_test/tamper  {"mode": "aud" | "expired" | "nonce"}   the next ID token is re-signed
//                                                              with that claim wrong
import { parseArgs } from 'node:util';
import { randomUUID } from 'node:crypto';
import * as jose from 'jose';
import Provider from 'oidc-provider';

const { values: args } = parseArgs({
  options: {
    port: { type: 'string', default: '0' },
    clients: { type: 'string', default: '[]' },
    'claims-in-id-token': { type: 'boolean', default: false },
  },
});

const accounts = new Map();
let tamper = null;

const { privateKey } = await jose.generateKeyPair('RS256', { extractable: true });
const jwk = { ...(await jose.exportJWK(privateKey)), kid: randomUUID(), alg: 'RS256', use: 'sig' };

function account(login) {
  const set = accounts.get(login) ?? {};
  return {
    sub: `subject-${login}`,
    email: set.email ?? login,
    email_verified: set.email_verified ?? true,
    groups: set.groups ?? [],
    name: login.split('@')[0],
  };
}

const clients = JSON.parse(args.clients).map((c) => ({
  grant_types: ['authorization_code'],
  response_types: ['code'],
  token_endpoint_auth_method: 'client_secret_basic',
  ...c,
}));

async function start(port) {
  const server = (await import('node:http')).createServer();
  await new Promise((resolve) => server.listen(Number(port), '127.0.0.1', resolve));
  const issuer = `http://127.0.0.1:${server.address().port}`;
  const provider = new Provider(issuer, {
    clients,
    jwks: { keys: [jwk] },
    pkce: { required: () => true },
    conformIdTokenClaims: !args['claims-in-id-token'],
    claims: {
      openid: ['sub'],
      email: ['email', 'email_verified'],
      profile: ['name'],
      groups: ['groups'],
    },
    scopes: ['openid', 'email', 'profile', 'groups'],
    features: { devInteractions: { enabled: true } },
    // First-party clients: no consent screen, the grant covers what was asked.
    async loadExistingGrant(ctx) {
      const grant = new ctx.oidc.provider.Grant({
        clientId: ctx.oidc.client.clientId,
        accountId: ctx.oidc.session.accountId,
      });
      grant.addOIDCScope(ctx.oidc.params.scope);
      await grant.save();
      return grant;
    },
    async findAccount(_ctx, id) {
      const login = id.replace(/^subject-/, '');
      return { accountId: id, claims: async () => account(login) };
    },
    ttl: { Session: 600, Interaction: 600, AuthorizationCode: 60, IdToken: 300, AccessToken: 300, Grant: 600 },
  });
  // The development sign-in form posts the login; accounts are keyed by subject.
  provider.use(async (ctx, next) => {
    if (ctx.method === 'POST' && ctx.path.startsWith('/_test/')) {
      const body = await new Promise((resolve) => {
        let data = '';
        ctx.req.on('data', (c) => { data += c; });
        ctx.req.on('end', () => resolve(data ? JSON.parse(data) : {}));
      });
      if (ctx.path === '/_test/account') accounts.set(body.email, body);
      else if (ctx.path === '/_test/tamper') tamper = body.mode;
      else ctx.throw(404);
      ctx.status = 204;
      return;
    }
    await next();
    if (ctx.path === '/token' && tamper && ctx.body?.id_token) {
      const mode = tamper;
      tamper = null;
      const claims = jose.decodeJwt(ctx.body.id_token);
      const now = Math.floor(Date.now() / 1000);
      if (mode === 'aud') claims.aud = 'some-other-client';
      if (mode === 'expired') Object.assign(claims, { iat: now - 1200, exp: now - 600 });
      if (mode === 'nonce') claims.nonce = 'not-the-one-sent';
      ctx.body = {
        ...ctx.body,
        id_token: await new jose.SignJWT(claims)
          .setProtectedHeader({ alg: 'RS256', kid: jwk.kid, typ: 'JWT' })
          .sign(privateKey),
      };
    }
  });
  // The login form's account id is the email typed; the subject is derived from it.
  const interactions = provider.interactionFinished.bind(provider);
  provider.interactionFinished = (req, res, result, opts) => {
    if (result?.login?.accountId && !result.login.accountId.startsWith('subject-')) {
      result.login.accountId = `subject-${result.login.accountId}`;
    }
    return interactions(req, res, result, opts);
  };
  if (process.env.OIDC_DEBUG) provider.on('grant.error', (_ctx, err) => console.error(err));
  server.on('request', provider.callback());
  process.stdout.write(`listening ${issuer}\n`);
}

await start(args.port);
