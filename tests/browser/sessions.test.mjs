// A researcher on a `--demo` server opens a session and works in it from the task page: the
// terminal (xterm.js over the shell tunnel) runs what they type in the task's environment, and
// a declared web port opens in a tab of its own.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";
import { startServer, startBrowser, hydrated, shot, signUpApi } from "./harness.mjs";

let server, browser;
before(async () => {
  server = await startServer({}, ["serve", "--demo"]);
  ({ browser } = await startBrowser());
});
after(async () => {
  await browser?.close();
  server?.stop();
});

test("a terminal on a running session's page runs what is typed", async () => {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 1000 } });
  const page = await ctx.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  const csrf = await signUpApi(ctx, server.base, "hopper@example.com", "Sess-ions-2026-ok", "Navy Lab");
  const res = await ctx.request.post(`${server.base}/api/v1/tasks`, {
    headers: { "x-csrf-token": csrf },
    data: { name: "notebook", image: "none", kind: "session", resources: { gpu: { count: 1 } } },
  });
  assert.equal(res.status(), 201, await res.text());
  const { id } = await res.json();

  await page.goto(`${server.base}/tasks/${id}`);
  await hydrated(page);
  // The terminal appears once the session runs.
  await page.waitForSelector("[data-testid=open-terminal]", { timeout: 60000 });
  await page.click("[data-testid=open-terminal]");
  await page.waitForSelector("[data-testid=terminal-status]:text('connected')", { timeout: 30000 });
  await page.waitForSelector(".xterm-helper-textarea", { state: "attached" });
  await page.focus(".xterm-helper-textarea");
  await page.keyboard.type("echo answer-$((6*7)) in $AUTODL_TASK_ID");
  await page.keyboard.press("Enter");
  await page.waitForFunction(
    () => document.querySelector(".xterm-rows")?.textContent.includes("answer-42 in"),
    null,
    { timeout: 30000 },
  );
  const rows = await page.textContent(".xterm-rows");
  assert.ok(rows.includes(`answer-42 in ${id}`), rows);
  await shot(page, "task-terminal");

  // Who opened it is in the task's timeline.
  const events = await (await ctx.request.get(`${server.base}/api/v1/tasks/${id}/events`)).json();
  assert.ok(events.some((e) => e.kind === "shell" && e.message.includes("hopper@example.com")), JSON.stringify(events));

  // Typing exit ends the shell; the page says so.
  await page.keyboard.type("exit 0");
  await page.keyboard.press("Enter");
  await page.waitForSelector("[data-testid=terminal-status]:text('the shell ended (exit 0)')", { timeout: 30000 });
  assert.deepEqual(errors, []);
  await ctx.close();
});

test("a session's web port opens from its page on an origin of its own", async () => {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await ctx.newPage();
  const csrf = await signUpApi(ctx, server.base, "lovelace@example.com", "Sess-ions-2026-ok", "Engine Lab");
  const port = await freePort();
  const app = readFileSync(new URL("../../server/tests/api/app_server.py", import.meta.url), "utf8");
  const res = await ctx.request.post(`${server.base}/api/v1/tasks`, {
    headers: { "x-csrf-token": csrf },
    data: {
      name: "notebook", image: "none", kind: "session", ports: [port], env: { APP: app },
      command: `exec python3 -c "$APP" ${port}`, resources: { gpu: { count: 1 } },
    },
  });
  assert.equal(res.status(), 201, await res.text());
  const { id } = await res.json();

  await page.goto(`${server.base}/tasks/${id}`);
  await hydrated(page);
  await page.waitForSelector("[data-testid=open-port]", { timeout: 60000 });
  assert.equal((await page.textContent("[data-testid=open-port]")).trim(), `Open ${port}`);
  await shot(page, "task-ports");
  const [tab] = await Promise.all([ctx.waitForEvent("page"), page.click("[data-testid=open-port]")]);
  await tab.waitForLoadState();
  // The app may still be starting: the proxy says so (502) until it listens.
  for (let i = 0; i < 50 && !(await tab.content()).includes("Hello from the task"); i++) {
    await new Promise((r) => setTimeout(r, 300));
    await tab.reload();
  }
  assert.ok((await tab.content()).includes("Hello from the task"), await tab.content());
  const url = new URL(tab.url());
  assert.equal(url.hostname, `${port}-${id}.apps.localhost`);
  assert.equal(url.pathname, "/");
  await shot(tab, "task-app");

  // The app's page cannot act as the person who opened it: the platform's cookies are not
  // its own, and the API does not answer another origin's scripts.
  assert.equal(await tab.evaluate(() => document.cookie), "_xsrf=abc");
  const read = await tab.evaluate(async (base) => {
    try {
      return (await fetch(`${base}/api/v1/me`, { credentials: "include" })).status;
    } catch {
      return "refused";
    }
  }, server.base);
  assert.equal(read, "refused");
  const events = await (await ctx.request.get(`${server.base}/api/v1/tasks/${id}/events`)).json();
  assert.ok(events.some((e) => e.message === `lovelace@example.com opened port ${port} in the browser`), JSON.stringify(events));
  await ctx.close();
});

function freePort() {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

test("an owner sets the organization's rules for sessions and idle GPUs", async () => {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 1000 } });
  const page = await ctx.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await signUpApi(ctx, server.base, "rules@example.com", "Sess-ions-2026-ok", "Rules Lab");
  await page.goto(`${server.base}/organization`);
  await hydrated(page);
  const form = page.locator("[data-testid=session-policy]");
  await form.waitFor();
  // The defaults are shown as they apply.
  assert.equal(await page.inputValue("#idle_util_pct"), "5");
  assert.equal(await page.inputValue("#idle_minutes"), "30");
  // Empty is no threshold at all: refused before anything is sent.
  await page.fill("#idle_util_pct", "");
  await page.click("[data-testid=save-session-policy]");
  await form.locator(".field-error:text('The threshold must be a number')").waitFor();
  await page.fill("#idle_util_pct", "10");
  await page.fill("#idle_minutes", "45");
  await page.fill("#max_session_hours", "8");
  await page.fill("#max_sessions_per_user", "2");
  await page.check("[data-testid=stop-idle-batch]");
  await page.click("[data-testid=save-session-policy]");
  await form.locator(".banner.ok:text('Saved.')").waitFor();
  const saved = await (await ctx.request.get(`${server.base}/api/v1/tenant/session-policy`)).json();
  assert.deepEqual(saved, {
    idle_util_pct: 10, idle_minutes: 45, stop_idle_batch: true, max_session_hours: 8, max_sessions_per_user: 2,
  });
  // The server's own rule is shown at its field.
  await page.fill("#idle_util_pct", "150");
  await page.click("[data-testid=save-session-policy]");
  await form.locator("#idle_util_pct-error:not(:empty)").waitFor();
  await shot(page, "org-session-rules");
  // A reload shows what is stored.
  await page.reload();
  await hydrated(page);
  assert.equal(await page.inputValue("#idle_minutes"), "45");
  assert.ok(await page.isChecked("[data-testid=stop-idle-batch]"));
  assert.deepEqual(errors, []);
  await ctx.close();
});
