// Notifications from a person's side: choosing what is emailed (a real SMTP server, aiosmtpd,
// takes the mail), and an organization's webhook added on its page whose deliveries a
// receiver here checks by their HMAC signature.
import { test, before, after } from "node:test";
import { spawn } from "node:child_process";
import { createServer } from "node:http";
import { createHmac } from "node:crypto";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";
import { startServer, startBrowser, hydrated, shot } from "./harness.mjs";

let server, browser, sink, mail;
const password = "N0tify-me-please";

before(async () => {
  const script = fileURLToPath(new URL("../../server/tests/api/smtp_sink.py", import.meta.url));
  sink = spawn(process.env.AUTODL_TEST_PYTHON || "python3", [script], { stdio: ["ignore", "pipe", "inherit"] });
  const lines = createInterface({ input: sink.stdout })[Symbol.asyncIterator]();
  const port = (await lines.next()).value.trim();
  mail = lines;
  server = await startServer({ AUTODL_SMTP_URL: `smtp://127.0.0.1:${port}`, AUTODL_WEBHOOK_ALLOW_INTERNAL: "true" }, ["serve", "--demo"]);
  ({ browser } = await startBrowser());
});
after(async () => {
  await browser?.close();
  server?.stop();
  sink?.kill();
});

/// The next email, its quoted-printable soft breaks undone.
async function nextMail() {
  const line = await Promise.race([mail.next(), new Promise((_, no) => setTimeout(() => no(new Error("no email in 60 s")), 60000))]);
  const got = JSON.parse(line.value);
  got.text = got.data.replaceAll("=\r\n", "").replaceAll("=\n", "").replaceAll("=3D", "=");
  return got;
}

/// The token of the sign-up link emailed to `to`.
async function signupToken(to) {
  const got = await nextMail();
  assert.deepEqual(got.to, [to]);
  const token = got.text.split("token=")[1]?.split(/\s/)[0];
  assert.ok(token, got.text);
  return token;
}

/// Signs up through the API where the server sends email: the emailed link finishes it.
/// Returns the CSRF token that writes must echo.
async function signUpByEmail(ctx, email, tenant) {
  const r = await ctx.request.post(`${server.base}/api/v1/auth/signup`, { data: { email, password, tenant_name: tenant } });
  assert.equal(r.status(), 202, await r.text());
  const token = await signupToken(email);
  const done = await ctx.request.post(`${server.base}/api/v1/auth/signup/confirm`, { data: { token } });
  assert.equal(done.status(), 201, await done.text());
  return (await ctx.cookies()).find((c) => c.name === "autodl_csrf").value;
}

/// A webhook receiver: each request's headers and body.
function receiver() {
  const got = [];
  const srv = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      got.push({ headers: req.headers, body });
      res.end("ok");
    });
  });
  return new Promise((resolve) => srv.listen(0, "127.0.0.1", () => resolve({ srv, got, url: `http://127.0.0.1:${srv.address().port}/hook` })));
}

test("a person chooses what is emailed; a failed task's email arrives", async () => {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await ctx.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  // Where the server sends email, a sign-up is finished from the link it emails.
  await page.goto(`${server.base}/signup`);
  await hydrated(page);
  await page.fill("#email", "grace@example.com");
  await page.fill("#password", password);
  await page.fill("#tenant_name", "Compilers");
  await page.click("button[type=submit]");
  await page.waitForSelector("[data-testid=signup-pending]:has-text('grace@example.com')");
  await shot(page, "34-signup-email-sent");
  const token = await signupToken("grace@example.com");
  await page.goto(`${server.base}/signup/confirm?token=${encodeURIComponent(token)}`);
  await page.waitForURL((u) => new URL(u).pathname === "/tasks");
  // The link works once.
  await page.goto(`${server.base}/signup/confirm?token=${encodeURIComponent(token)}`);
  await page.waitForSelector("[data-testid=signup-confirm-error]");
  const csrf = (await ctx.cookies()).find((c) => c.name === "autodl_csrf").value;
  await page.goto(`${server.base}/account`);
  await hydrated(page);
  await page.waitForSelector("[data-testid=email-settings]:has-text('emailed to grace@example.com')");
  await page.check("[data-testid='email-task.failed']");
  await page.check("[data-testid='email-quota.nearly_used']");
  await page.click("[data-testid=email-save]");
  await page.waitForSelector("[data-testid=email-saved]");
  await page.reload();
  await hydrated(page);
  assert.equal(await page.isChecked("[data-testid='email-task.failed']"), true);
  assert.equal(await page.isChecked("[data-testid='email-task.finished']"), false);
  await page.locator("[data-testid=email-settings]").scrollIntoViewIfNeeded();
  await shot(page, "35-email-settings");

  // A task that fails for good (no retries): its owner is emailed.
  const res = await ctx.request.post(`${server.base}/api/v1/tasks`, {
    headers: { "x-csrf-token": csrf },
    data: { name: "doomed", image: "none", command: "exit 3", resources: { gpu: { count: 1 } } },
  });
  assert.equal(res.status(), 201, await res.text());
  const { id } = await res.json();
  const got = await nextMail();
  assert.deepEqual(got.to, ["grace@example.com"]);
  assert.ok(got.data.includes("Subject: Task doomed failed"), got.data);
  assert.ok(got.data.includes(id), got.data);
  assert.deepEqual(errors, []);
  await ctx.close();
});

test("an organization's webhook is added on its page and its deliveries are signed", async (testCtx) => {
  const hook = await receiver();
  // Closed however the test ends: a listening socket would keep this file from exiting.
  testCtx.after(() => {
    hook.srv.closeAllConnections();
    hook.srv.close();
  });
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 1000 } });
  const page = await ctx.newPage();
  page.on("dialog", (d) => d.accept());
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  const csrf = await signUpByEmail(ctx, "barbara@example.com", "Liskov Lab");
  await page.goto(`${server.base}/organization`);
  await hydrated(page);
  await page.waitForSelector("[data-testid=webhook-list]:has-text('No webhooks yet')");
  await page.fill("[data-testid=webhook-url]", hook.url);
  await page.check("[data-testid='webhook-task.finished']");
  await page.click("[data-testid=webhook-add]");
  const secret = (await page.textContent("[data-testid=webhook-secret] code")).trim();
  assert.match(secret, /^[0-9a-f]{32,}$/);
  await page.waitForSelector(`[data-testid=webhook-list] td:has-text('${hook.url}')`);

  const res = await ctx.request.post(`${server.base}/api/v1/tasks`, {
    headers: { "x-csrf-token": csrf },
    data: { name: "quick", image: "none", command: "true", resources: { gpu: { count: 1 } } },
  });
  assert.equal(res.status(), 201, await res.text());
  for (let i = 0; i < 120 && hook.got.length === 0; i++) await new Promise((r) => setTimeout(r, 500));
  assert.equal(hook.got.length, 1, "the finished task's webhook arrived");
  const { headers, body } = hook.got[0];
  const [t, v1] = headers["x-autodl-signature"].split(",").map((p) => p.split("=")[1]);
  const want = createHmac("sha256", secret).update(`${t}.${body}`).digest("hex");
  assert.equal(v1, want, "the signature is the body's, under the secret shown once");
  assert.equal(JSON.parse(body).event, "task.finished");

  await page.click("[data-testid=webhook-deliveries]");
  await page.waitForSelector("[data-testid=webhook-delivery-list] .badge:text('delivered')");
  await page.locator("[data-testid=webhooks]").scrollIntoViewIfNeeded();
  await shot(page, "36-webhooks");
  assert.deepEqual(errors, []);
  await ctx.close();
});
