// A researcher signs up, signs out and in, creates an API key, sees it listed, uses it and
// revokes it — all in a hydrated page that never reloads.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, startBrowser, hydrated, shot } from "./harness.mjs";

let server, browser;
before(async () => {
  server = await startServer();
  ({ browser } = await startBrowser());
});
after(async () => {
  await browser?.close();
  server?.stop();
});

const email = "ada@example.com";
const password = "Tr41n-all-the-things";

test("sign up, log in, create and revoke an API key", async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));

  await page.goto(`${server.base}/signup`);
  await hydrated(page);
  await shot(page, "01-signup");
  // A marker that a full page load would wipe out.
  await page.evaluate(() => { window.__noReload = 42; });

  // Inline validation: bad email (checked in the browser), then a weak password (from the server).
  await page.fill("#email", "not-an-email");
  await page.fill("#password", "x");
  await page.click("button[type=submit]");
  await page.waitForSelector("#email-error:text('valid email')");
  await page.fill("#email", email);
  await page.fill("#password", "aaaaaaaaaaaa");
  await page.fill("#tenant_name", "Vision Lab");
  await page.click("button[type=submit]");
  await page.waitForSelector("#password-error:text('too weak')");
  await shot(page, "02-signup-errors");

  await page.fill("#password", password);
  await page.click("button[type=submit]");
  await page.waitForURL((u) => new URL(u).pathname === "/");
  await page.waitForSelector("[data-testid=nav-user]:text('ada@example.com')");
  await page.waitForSelector("h1:text('Dashboard')");
  assert.equal(await page.evaluate(() => window.__noReload), 42, "navigation after sign-up must not reload");

  // Sign out and back in through the form.
  await page.click("button:text('Sign out')");
  await page.waitForURL("**/login");
  await page.fill("#email", email);
  await page.fill("#password", "Wrong-password-1");
  await page.click("button[type=submit]");
  await page.waitForSelector(".banner.error:text('wrong email or password')");
  await page.fill("#password", password);
  await page.click("button[type=submit]");
  await page.waitForURL((u) => new URL(u).pathname === "/");
  await page.click("nav a[href='/account']");
  await page.waitForURL("**/account");
  await page.waitForSelector("[data-testid=api-keys] td:text('No keys yet.')");
  await shot(page, "03-account");

  // Create a key: shown once, then listed by name and prefix.
  await page.fill("#key-name", "laptop");
  await page.click("button:text('Create key')");
  const keyEl = await page.waitForSelector("[data-testid=new-key-value]");
  const key = (await keyEl.textContent()).trim();
  assert.match(key, /^adl_[0-9a-f]{48}$/);
  await page.waitForSelector("tr[data-key-name=laptop]");
  const row = await page.textContent("tr[data-key-name=laptop]");
  assert.ok(row.includes(key.slice(0, 12)), "the list shows the key's prefix");
  assert.ok(!row.includes(key), "the list never shows the whole key");
  await shot(page, "04-key-created");

  // The key works for programs.
  let res = await fetch(`${server.base}/api/v1/me`, { headers: { Authorization: `Bearer ${key}` } });
  assert.equal(res.status, 200);
  assert.equal((await res.json()).email, email);

  // Revoke it in the page; the row disappears without a reload and the key stops working.
  // Revoking asks first: saying no keeps the key.
  await page.click("button:text('Done')");
  let asked = "";
  page.once("dialog", (d) => { asked = d.message(); d.dismiss(); });
  await page.click("tr[data-key-name=laptop] button:text('Revoke')");
  assert.match(asked, /Revoke the key "laptop"/);
  res = await fetch(`${server.base}/api/v1/me`, { headers: { Authorization: `Bearer ${key}` } });
  assert.equal(res.status, 200, "a dismissed revoke keeps the key working");
  page.once("dialog", (d) => d.accept());
  await page.click("tr[data-key-name=laptop] button:text('Revoke')");
  await page.waitForSelector("tr[data-key-name=laptop]", { state: "detached" });
  res = await fetch(`${server.base}/api/v1/me`, { headers: { Authorization: `Bearer ${key}` } });
  assert.equal(res.status, 401);
  assert.equal(await page.evaluate(() => window.__noReload), 42, "the page hydrated and never reloaded");
  await shot(page, "05-key-revoked");
  assert.deepEqual(errors, [], "no script errors in the page");
});

test("pages render on the server before hydration", async () => {
  for (const path of ["/", "/login", "/signup", "/account", "/organization", "/admin"]) {
    const res = await fetch(`${server.base}${path}`);
    assert.equal(res.status, 200, path);
    const html = await res.text();
    assert.ok(html.includes('<a class="brand" href="/">autodl</a>'), `${path} has the layout`);
    assert.ok(html.includes("/pkg/autodl.js"), `${path} loads the app`);
  }
  const res = await fetch(`${server.base}/no-such-page`);
  assert.ok((await res.text()).includes("Page not found"));
});

test("layout works at phone width", async () => {
  const page = await browser.newPage({ viewport: { width: 390, height: 844 } });
  await page.goto(`${server.base}/login`);
  await hydrated(page);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth > window.innerWidth + 1);
  assert.equal(overflow, false, "no horizontal scrolling on a phone");
  await shot(page, "06-login-phone");
});
