// Every page, checked with axe-core (the engine behind Lighthouse's accessibility audit) in
// headless Chromium, signed in as a platform admin with data on the pages, in light and dark
// mode and at phone width: no serious or critical violation anywhere.
import { test, before, after } from "node:test";
import { execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import assert from "node:assert/strict";
import { startServer, startBrowser, hydrated, shot, logIn } from "./harness.mjs";

const axePath = createRequire(import.meta.url).resolve("axe-core/axe.min.js");
const password = "Acc3ss-for-every0ne";
let server, browser;
before(async () => {
  server = await startServer({}, ["serve", "--demo"]);
  ({ browser } = await startBrowser());
  execFileSync(process.env.AUTODL_SERVER_BIN, ["admin", "create-admin", "--email", "axe@example.com", "--password", password], {
    env: { ...process.env, AUTODL_DATABASE_URL: `sqlite://${server.dir}/autodl.db`, RUST_LOG: "warn" },
    stdio: ["ignore", "ignore", "inherit"],
  });
});
after(async () => {
  await browser?.close();
  server?.stop();
});

/// Serious and critical violations on the page as it is now, as readable lines.
async function audit(page) {
  await page.addScriptTag({ path: axePath });
  const result = await page.evaluate(async () => {
    // eslint-disable-next-line no-undef
    const r = await axe.run(document, { resultTypes: ["violations"] });
    return r.violations
      .filter((v) => v.impact === "serious" || v.impact === "critical")
      .map((v) => `${v.impact} ${v.id}: ${v.help} — ${v.nodes.slice(0, 3).map((n) => n.target.join(" ")).join(" | ")}`);
  });
  return result;
}

test("no serious or critical accessibility violations on any page", async () => {
  const found = [];
  for (const scheme of ["light", "dark"]) {
    // The page's own security policy forbids injected scripts; only this audit bypasses it.
    const ctx = await browser.newContext({ bypassCSP: true, colorScheme: scheme, viewport: { width: 1280, height: 900 } });
    const page = await ctx.newPage();
    await logIn(page, server.base, "axe@example.com", password);
    await page.waitForURL((u) => new URL(u).pathname === "/");
    const csrf = (await ctx.cookies()).find((c) => c.name === "autodl_csrf").value;
    let task = null;
    let sweep = null;
    if (scheme === "light") {
      const s = await ctx.request.post(`${server.base}/api/v1/sweeps`, {
        headers: { "X-CSRF-Token": csrf },
        data: {
          name: "axe-sweep",
          template: { name: "lr-${lr}", image: "python:3.12", command: "echo ${lr}", resources: { gpu: { count: 0 } } },
          parameters: { lr: [0.1, 0.01] },
        },
      });
      assert.equal(s.status(), 201, await s.text());
      sweep = (await s.json()).id;
      const r = await ctx.request.post(`${server.base}/api/v1/tasks`, {
        headers: { "X-CSRF-Token": csrf },
        data: { name: "axe-task", image: "python:3.12", command: "sleep 300", resources: { gpu: { count: 1 } } },
      });
      assert.equal(r.status(), 201, await r.text());
      task = (await r.json()).id;
      await ctx.request.post(`${server.base}/api/v1/tasks/${task}/metrics`, { headers: { "X-CSRF-Token": csrf }, data: { loss: 1.5, step: 1 } });
      await ctx.request.post(`${server.base}/api/v1/tasks/${task}/metrics`, { headers: { "X-CSRF-Token": csrf }, data: { loss: 0.9, step: 2 } });
    } else {
      const list = await (await ctx.request.get(`${server.base}/api/v1/tasks?limit=100`)).json();
      task = list.items.find((t) => t.name === "axe-task").id;
      sweep = (await (await ctx.request.get(`${server.base}/api/v1/sweeps`)).json())[0].id;
    }
    const pages = ["/", "/tasks", `/tasks/${task}`, "/submit", "/cluster", "/account", "/organization", "/admin", "/admin?tab=users", "/admin?tab=nodes",
      "/admin?tab=usage", "/admin?tab=tokens", "/admin?tab=policy", "/admin?tab=sso",
      "/audit", "/usage", "/sweeps", `/sweeps/${sweep}`,
      `/compare?ids=${task}`, "/no-such-page"];
    for (const [width, label] of [[1280, "wide"], [390, "phone"]]) {
      await page.setViewportSize({ width, height: 900 });
      for (const path of pages) {
        await page.goto(`${server.base}${path}`);
        await hydrated(page);
        for (const v of await audit(page)) found.push(`${scheme} ${label} ${path}: ${v}`);
      }
    }
    await shot(page, `60-axe-${scheme}`);
    // Signed out: the landing, sign-in and sign-up pages.
    const out = await browser.newContext({ bypassCSP: true, colorScheme: scheme });
    const anon = await out.newPage();
    for (const path of ["/", "/login", "/signup"]) {
      await anon.goto(`${server.base}${path}`);
      await hydrated(anon);
      for (const v of await audit(anon)) found.push(`${scheme} signed-out ${path}: ${v}`);
    }
    await out.close();
    await ctx.close();
  }
  assert.deepEqual(found, [], found.join("\n"));
});
