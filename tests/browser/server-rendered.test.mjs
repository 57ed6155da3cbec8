// Pages are rendered on the server with their data: with JavaScript off, every reading page
// shows what the API holds for the signed-in caller. A deep link survives signing in.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, startBrowser, hydrated, shot, signUpApi } from "./harness.mjs";

let server, browser;
before(async () => {
  server = await startServer();
  ({ browser } = await startBrowser());
});
after(async () => {
  await browser?.close();
  server?.stop();
});

const password = "Tr41n-all-the-things";

/// Signs up through the API in `ctx` (its cookies are the browser's), returns the CSRF token.
const signUp = (ctx, email, tenant) => signUpApi(ctx, server.base, email, password, tenant);

test("reading pages show their data with JavaScript off", async () => {
  const ctx = await browser.newContext({ javaScriptEnabled: false, viewport: { width: 1280, height: 900 } });
  const csrf = await signUp(ctx, "noscript@example.com", "Static Lab");
  const headers = { "X-CSRF-Token": csrf };
  const submitted = await ctx.request.post(`${server.base}/api/v1/tasks`, {
    headers,
    data: { name: "resnet-without-js", image: "python:3.12", command: "echo hi", resources: { gpu: { count: 0 } } },
  });
  assert.equal(submitted.status(), 201, await submitted.text());
  const task = await submitted.json();
  const key = await ctx.request.post(`${server.base}/api/v1/api-keys`, { headers, data: { name: "laptop-key" } });
  assert.equal(key.status(), 201, await key.text());

  const page = await ctx.newPage();
  const expect = {
    "/": ["Dashboard", "resnet-without-js", "noscript@example.com · Static Lab"],
    "/tasks": ["resnet-without-js", "noscript@example.com"],
    [`/tasks/${task.id}`]: ["resnet-without-js", "python:3.12", "Why it waits"],
    "/account": ["laptop-key", "Static Lab"],
    "/organization": ["Static Lab", "noscript@example.com"],
    "/cluster": ["Cluster"],
    "/submit": ["Submit"],
  };
  for (const [i, [path, texts]] of Object.entries(expect).entries()) {
    const res = await page.goto(`${server.base}${path}`);
    await shot(page, `40-without-js-${i}`);
    assert.equal(res.status(), 200, path);
    const body = await page.locator("body").innerText();
    for (const t of texts) assert.ok(body.includes(t), `${path} shows "${t}" without JavaScript:\n${body}`);
    assert.ok(!body.includes("Loading…"), `${path} is rendered, not loading:\n${body}`);
    assert.equal(await page.getAttribute("body", "data-hydrated"), null, "JavaScript stayed off");
    // The signed-in navigation is in the HTML: no signed-out flash before hydration.
    assert.ok(body.includes("Sign out") && !body.includes("Create account"), `${path} has the signed-in nav`);
  }
  // Form values are in the HTML too.
  assert.equal(await page.locator("#image").inputValue(), "pytorch/pytorch:2.1");

  // Signed in, the sign-in and sign-up pages send the visitor on (the server redirects: no
  // form shows, even without JavaScript), to where the sign-in would have led.
  for (const [path, lands] of [["/login", "/"], ["/login?next=%2Ftasks", "/tasks"], ["/signup", "/"]]) {
    const res = await page.goto(`${server.base}${path}`);
    assert.equal(new URL(page.url()).pathname, lands, path);
    assert.equal(res.status(), 200, path);
    assert.equal(await page.locator("#password").count(), 0, `${path} shows no sign-in form`);
  }

  // The task list's filters are a plain form and its state is in the URL: without
  // JavaScript, filtering by state still works.
  await page.goto(`${server.base}/tasks`);
  await page.selectOption("[data-testid=filter-state]", "completed");
  await page.click("[data-testid=filter-apply]");
  await page.waitForURL("**/tasks?state=completed*");
  assert.ok((await page.locator("body").innerText()).includes("No tasks match."), "nothing completed yet");
  await page.goto(`${server.base}/tasks?state=pending`);
  assert.equal(await page.locator("[data-testid=filter-state]").inputValue(), "pending");
  // Typed filters are applied by the form and shown again in the rendered page.
  await page.fill("[data-testid=filter-label]", "team=nobody");
  await page.fill("[data-testid=filter-search]", "resnet");
  await page.click("[data-testid=filter-apply]");
  await page.waitForURL("**/tasks?*label=team%3Dnobody*");
  assert.equal(await page.locator("[data-testid=filter-label]").inputValue(), "team=nobody");
  assert.equal(await page.locator("[data-testid=filter-search]").inputValue(), "resnet");
  assert.ok((await page.locator("body").innerText()).includes("No tasks match."), "no task has that label");
  await page.goto(`${server.base}/tasks?state=pending`);
  assert.ok((await page.locator("[data-testid=tasks]").innerText()).includes("resnet-without-js"));

  // Another organization's task is not shown, rendered or not.
  const other = await browser.newContext({ javaScriptEnabled: false });
  await signUp(other, "intruder@example.com", "Other Lab");
  const peek = await other.newPage();
  await peek.goto(`${server.base}/tasks/${task.id}`);
  const seen = await peek.locator("body").innerText();
  assert.ok(!seen.includes("resnet-without-js"), "another tenant's task stays hidden");
  await other.close();
  await ctx.close();
});

test("a deep link leads through sign-in back to the page", async () => {
  const owner = await browser.newContext();
  await signUp(owner, "deeplink@example.com", "Link Lab");
  const r = await owner.request.get(`${server.base}/api/v1/tasks?limit=1`);
  assert.equal(r.status(), 200);
  await owner.close();

  const ctx = await browser.newContext();
  const page = await ctx.newPage();
  await page.goto(`${server.base}/tasks?state=pending`);
  await hydrated(page);
  const link = page.locator("[data-testid=sign-in-link]");
  assert.equal(await link.getAttribute("href"), "/login?next=%2Ftasks%3Fstate%3Dpending");
  await link.click();
  await page.waitForURL("**/login?next=*");
  await hydrated(page);
  await page.fill("#email", "deeplink@example.com");
  await page.fill("#password", password);
  await page.click("button[type=submit]");
  await page.waitForURL((u) => new URL(u).pathname === "/tasks");
  await page.waitForSelector("[data-testid=tasks]");

  // A `next` that points off the site is ignored.
  await page.goto(`${server.base}/login?next=//evil.example/x`);
  await hydrated(page);
  await page.waitForURL((u) => new URL(u).pathname === "/");
  await ctx.close();
});

test("dark mode follows the system, and the first Tab skips the navigation", async () => {
  const ctx = await browser.newContext({ colorScheme: "dark" });
  const page = await ctx.newPage();
  await page.goto(`${server.base}/login`);
  await hydrated(page);
  const bg = await page.evaluate(() => getComputedStyle(document.documentElement).backgroundColor);
  const [r, g, b] = bg.match(/\d+/g).map(Number);
  assert.ok(r + g + b < 120, `a dark background in dark mode, got ${bg}`);
  await shot(page, "41-login-dark");
  await page.keyboard.press("Tab");
  assert.equal(await page.evaluate(() => document.activeElement.textContent), "Skip to content");
  await page.keyboard.press("Enter");
  assert.equal(await page.evaluate(() => document.activeElement.id), "main");
  await ctx.close();
});
