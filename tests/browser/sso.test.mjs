// Single sign-on in Chromium against a real OpenID provider (oidc-provider from the npm
// registry, tests/oidc/provider.mjs): an owner sets it up on the organization page, people
// sign in with the button on the sign-in page, and tokens with the wrong audience, expired
// ones and a replayed answer are refused with the reason shown.
import { test, before, after } from "node:test";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";
import { startServer, startBrowser, hydrated, shot, signUpApi } from "./harness.mjs";

let server, browser, provider, issuer;
const password = "S1ngle-sign-on!";

async function startProvider(base) {
  const dir = fileURLToPath(new URL("../oidc/", import.meta.url));
  const clients = [{ client_id: "autodl", client_secret: "provider-given-secret", redirect_uris: [`${base}/api/v1/auth/sso/callback`] }];
  const child = spawn("node", ["provider.mjs", "--port", "0", "--clients", JSON.stringify(clients)], { cwd: dir, stdio: ["ignore", "pipe", "ignore"] });
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const first = (await lines.next()).value;
  assert.ok(first?.startsWith("listening "), `provider said ${first}`);
  return { child, issuer: first.slice("listening ".length) };
}

async function control(path, body) {
  const r = await fetch(`${issuer}/_test/${path}`, { method: "POST", body: JSON.stringify(body) });
  assert.equal(r.status, 204);
}

before(async () => {
  server = await startServer({ AUTODL_SSO_ALLOW_INTERNAL: "true" });
  ({ child: provider, issuer } = await startProvider(server.base));
  ({ browser } = await startBrowser());
});
after(async () => {
  await browser?.close();
  server?.stop();
  provider?.kill();
});

/// From the sign-in page through the provider's form; resolves where the browser ends up.
async function signInWithProvider(page, login) {
  await page.goto(`${server.base}/login?next=/tasks`);
  await hydrated(page);
  // An organization's button shows for an email of its domain.
  await page.fill("#email", login);
  await page.click("a.sso:has-text('Sign in with Acme login')");
  await page.waitForSelector("input[name=login]");
  await page.fill("input[name=login]", login);
  await page.fill("input[name=password]", "anything");
  await page.click("button[type=submit]");
  await page.waitForURL((u) => new URL(u).origin === server.base && !new URL(u).pathname.startsWith("/api/"));
  await hydrated(page);
  return new URL(page.url());
}

test("an owner sets up single sign-on and people sign in with it; bad tokens are refused", async () => {
  const owner = await browser.newContext({ viewport: { width: 1280, height: 1000 } });
  const page = await owner.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await signUpApi(owner, server.base, "owner@acme.test", password, "Acme");
  await page.goto(`${server.base}/organization`);
  await hydrated(page);
  await page.waitForSelector("[data-testid=sso-redirect-uri]");
  assert.equal(await page.textContent("[data-testid=sso-redirect-uri]"), `${server.base}/api/v1/auth/sso/callback`);
  await page.fill("[data-testid=sso-label]", "Acme login");
  await page.fill("[data-testid=sso-issuer]", issuer);
  await page.fill("[data-testid=sso-client-id]", "autodl");
  await page.fill("[data-testid=sso-client-secret]", "provider-given-secret");
  await page.fill("[data-testid=sso-allowed-domains]", "acme.test");
  await page.fill("[data-testid=sso-scopes]", "groups");
  await page.fill("[data-testid=sso-role-claim]", "groups");
  await page.fill("[data-testid=sso-role-map]", "ml-admins = admin");
  await page.selectOption("[data-testid=sso-default-role]", "member");
  await page.uncheck("[data-testid=sso-password-login]");
  await page.click("[data-testid=sso-save]");
  await page.waitForSelector("[data-testid=sso-saved]");
  await page.locator("[data-testid=sso-settings]").scrollIntoViewIfNeeded();
  await shot(page, "39-sso-settings");
  // An issuer that does not answer is named in place, and nothing is changed.
  await page.fill("[data-testid=sso-issuer]", "http://127.0.0.1:1");
  await page.click("[data-testid=sso-save]");
  // A kept secret goes only to the issuer it was given for: it is asked for again.
  await page.waitForSelector("[data-testid=sso-settings] .field-error:has-text('client secret given again')");
  await page.fill("[data-testid=sso-client-secret]", "provider-given-secret");
  await page.click("[data-testid=sso-save]");
  await page.waitForSelector("[data-testid=sso-settings] .field-error:has-text('could not read')");
  await page.reload();
  await hydrated(page);
  await page.waitForFunction(() => document.querySelector("[data-testid=sso-issuer]")?.value.startsWith("http://127.0.0.1"));
  assert.equal(await page.isChecked("[data-testid=sso-password-login]"), false);

  // Someone new signs in with the button: their account is made, with the mapped role.
  await control("account", { email: "ada@acme.test", email_verified: true, groups: ["ml-admins"] });
  const ada = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const adaPage = await ada.newPage();
  adaPage.on("pageerror", (e) => errors.push(String(e)));
  await adaPage.goto(`${server.base}/login`);
  await hydrated(adaPage);
  assert.equal(await adaPage.locator("a.sso").count(), 0, "no organization's button for nobody");
  await adaPage.fill("#email", "ada@acme.test");
  await adaPage.waitForSelector("a.sso");
  await shot(adaPage, "40-sso-sign-in-page");
  const callbacks = [];
  adaPage.on("request", (r) => r.url().includes("/api/v1/auth/sso/callback") && callbacks.push(r.url()));
  const landed = await signInWithProvider(adaPage, "ada@acme.test");
  assert.equal(landed.pathname, "/tasks");
  const me = await adaPage.evaluate(async () => (await fetch("/api/v1/me")).json());
  assert.equal(me.email, "ada@acme.test");
  assert.equal(me.role, "admin");
  assert.equal(me.tenant_name, "Acme");

  // The provider's answer replayed: that sign-in was used.
  const replay = await browser.newContext();
  const replayPage = await replay.newPage();
  await replayPage.goto(callbacks[0]);
  await hydrated(replayPage);
  assert.match(await replayPage.textContent("[data-testid=sso-error]"), /already used/);
  assert.equal((await replayPage.evaluate(async () => (await fetch("/api/v1/me")).status)), 401);

  // Tokens for another application, and expired ones, are refused with the reason shown.
  for (const [mode, words] of [["aud", /wrong audience/], ["expired", /expired/]]) {
    const ctx = await browser.newContext();
    const p = await ctx.newPage();
    p.on("pageerror", (e) => errors.push(String(e)));
    await control("tamper", { mode });
    const at = await signInWithProvider(p, "bob@acme.test");
    assert.equal(at.pathname, "/login", mode);
    assert.match(await p.textContent("[data-testid=sso-error]"), words);
    assert.equal(await p.evaluate(async () => (await fetch("/api/v1/me")).status), 401, mode);
    if (mode === "aud") await shot(p, "41-sso-refused");
    await ctx.close();
  }

  // Passwords are off for this organization, but its owner keeps theirs (the way back in).
  const pw = await browser.newContext();
  const pwPage = await pw.newPage();
  await pwPage.goto(`${server.base}/login`);
  await hydrated(pwPage);
  await pwPage.fill("#email", "owner@acme.test");
  await pwPage.fill("#password", password);
  await pwPage.click("button[type=submit]");
  await pwPage.waitForURL((u) => new URL(u).pathname === "/");
  assert.deepEqual(errors, []);
  for (const c of [owner, ada, replay, pw]) await c.close();
});
