// A researcher on a `--demo` server opens a session and works in it from the task page: the
// terminal (xterm.js over the shell tunnel) runs what they type in the task's environment.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
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
