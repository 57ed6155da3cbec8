// An administrator's day on a `--demo` server: invite a researcher, cap their GPUs (their third
// task then waits and says it is the quota), drain the node their tasks run on, and watch the
// tasks move to the other node without anyone reloading the researcher's page.
import { test, before, after } from "node:test";
import { execFileSync } from "node:child_process";
import assert from "node:assert/strict";
import { startServer, startBrowser, hydrated, shot, logIn } from "./harness.mjs";

let server, browser;
before(async () => {
  server = await startServer({}, ["serve", "--demo"]);
  ({ browser } = await startBrowser());
  execFileSync(process.env.AUTODL_SERVER_BIN, ["admin", "create-admin", "--email", "root@example.com", "--password", password], {
    env: { ...process.env, AUTODL_DATABASE_URL: `sqlite://${server.dir}/autodl.db`, RUST_LOG: "warn" },
    stdio: ["ignore", "ignore", "inherit"],
  });
});
after(async () => {
  await browser?.close();
  server?.stop();
});

const password = "Dr41n-the-rack-now";

async function submit(page, name) {
  await page.click("[data-testid=nav-submit]");
  await page.waitForURL("**/submit");
  await page.waitForSelector("#gpu_type option[value='A40']", { state: "attached" });
  await page.fill("#name", name);
  await page.fill("#command", "sleep 300");
  await page.selectOption("#gpu_type", "");
  await page.fill("#gpu_count", "1");
  await page.click("[data-testid=submit]");
  await page.waitForURL(/\/tasks\/[0-9a-f-]+$/);
  await page.waitForSelector(`[data-testid=task-name]:text('${name}')`);
  return page.url();
}

/// The node a task's latest attempt runs on, from the API (the page shows the same table).
async function nodesOf(page, url) {
  const id = url.split("/").pop();
  return page.evaluate(async (id) => {
    const res = await fetch(`/api/v1/tasks/${id}/attempts`);
    return (await res.json()).map((a) => a.placement.map((p) => p.node).join(","));
  }, id);
}

test("set a member's quota, drain a node, see the tasks move", async () => {
  const adminCtx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const admin = await adminCtx.newPage();
  admin.on("dialog", (d) => d.accept());
  const errors = [];
  admin.on("pageerror", (e) => errors.push(String(e)));
  await logIn(admin, server.base, "root@example.com", password);

  // Invite a researcher into the administrator's organization.
  await admin.goto(`${server.base}/organization`);
  await hydrated(admin);
  await admin.fill("#invite-email", "kai@example.com");
  await admin.click("button:text('Invite')");
  const link = (await admin.textContent("[data-testid=invite-link] code")).trim();

  const researcherCtx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const researcher = await researcherCtx.newPage();
  researcher.on("dialog", (d) => d.accept());
  researcher.on("pageerror", (e) => errors.push(String(e)));
  await researcher.goto(new URL(link, server.base).href);
  await hydrated(researcher);
  await researcher.waitForSelector("text=You are invited to join");
  await researcher.fill("#email", "kai@example.com");
  await researcher.fill("#password", password);
  await researcher.click("button[type=submit]");
  await researcher.waitForURL((u) => new URL(u).pathname === "/");

  // The administrator caps the researcher at two GPUs at once.
  await admin.reload();
  await hydrated(admin);
  await admin.click("[data-testid=members] tr:has-text('kai@example.com') button:text('Quota')");
  await admin.waitForSelector("h2:text('Quota for kai@example.com')");
  await admin.fill("#max_gpus", "2");
  await admin.click("button:text('Save quota')");
  await admin.waitForSelector(".banner.ok:text('Saved.')");
  await shot(admin, "30-admin-member-quota");

  // Two one-GPU tasks run; the third waits, and its page says it is the quota.
  const first = await submit(researcher, "shard-1");
  await researcher.waitForSelector("[data-testid=task-name] [data-testid=state]:text('running')", { timeout: 30000 });
  const second = await submit(researcher, "shard-2");
  await researcher.waitForSelector("[data-testid=task-name] [data-testid=state]:text('running')", { timeout: 30000 });
  const third = await submit(researcher, "shard-3");
  await researcher.waitForSelector("[data-testid=waiting]:has-text('over your GPU quota: 2 of 2 GPUs in use')", { timeout: 30000 });
  await shot(researcher, "31-task-over-quota");
  await researcher.click("[data-testid=cancel]");
  await researcher.waitForSelector("[data-testid=task-name] [data-testid=state]:text('cancelled')", { timeout: 15000 });

  // The administrator drains the node the first task runs on.
  const [before] = await nodesOf(researcher, first);
  assert.ok(before, "the first task has a node");
  await researcher.goto(first);
  await hydrated(researcher);
  await researcher.evaluate(() => { window.__noReload = 1; });
  await admin.goto(`${server.base}/admin?tab=nodes`);
  await hydrated(admin);
  // A ready node offers Cordon, not Uncordon; a drained one the other way round.
  await admin.waitForSelector(`[data-testid=admin-nodes] tr[data-node='${before}'] [data-testid=cordon]`);
  assert.equal(await admin.locator(`[data-testid=admin-nodes] tr[data-node='${before}'] [data-testid=uncordon]`).count(), 0);
  await admin.click(`[data-testid=admin-nodes] tr[data-node='${before}'] button:text('Drain')`);
  await admin.waitForSelector(`[data-testid=admin-nodes] tr[data-node='${before}'] .badge:text('cordoned')`);
  await admin.waitForSelector(`[data-testid=admin-nodes] tr[data-node='${before}'] [data-testid=uncordon]`);
  assert.equal(await admin.locator(`[data-testid=admin-nodes] tr[data-node='${before}'] [data-testid=cordon]`).count(), 0);
  // The users tab finds people by email or organization; the search is in the URL.
  await admin.click("[data-testid=tab-users]");
  await admin.waitForSelector("[data-testid=admin-users]");
  await admin.fill("[data-testid=admin-search]", "root@");
  await admin.press("[data-testid=admin-search]", "Enter");
  await admin.waitForURL("**/admin?tab=users&q=root*");
  await admin.waitForSelector("[data-testid=admin-count]:text('1 found')");
  assert.equal(await admin.locator("[data-testid=admin-users] tbody tr").count(), 1);
  // That is the admin: nobody is offered to disable or demote themselves.
  assert.equal(await admin.locator("[data-testid=admin-users] tbody tr button").count(), 0);
  await admin.click("[data-testid=tab-nodes]");
  await admin.waitForSelector("[data-testid=admin-nodes]");
  await shot(admin, "32-admin-node-drained");

  // The researcher's page shows a second attempt, on the other node, running.
  await researcher.waitForFunction(
    () => document.querySelectorAll("[data-testid=attempts] tbody tr").length >= 2, null, { timeout: 60000 });
  await researcher.waitForSelector("[data-testid=task-name] [data-testid=state]:text('running')", { timeout: 60000 });
  await researcher.waitForSelector("[data-testid=events] .badge:text('drained')", { timeout: 30000 });
  assert.equal(await researcher.evaluate(() => window.__noReload), 1, "the task page updated without a reload");
  for (const url of [first, second]) {
    const nodes = await nodesOf(researcher, url);
    assert.notEqual(nodes[nodes.length - 1], before, `${url} left the drained node`);
  }
  await shot(researcher, "33-task-moved");

  // The cluster view agrees: nothing runs on the drained node.
  await researcher.goto(`${server.base}/cluster`);
  await hydrated(researcher);
  await researcher.waitForSelector("[data-testid=cluster-summary]:has-text('2 of 8')", { timeout: 30000 });
  assert.equal(await researcher.locator(`[data-node='${before}'] [data-testid=gpu-cell][data-tasks='1']`).count(), 0);

  for (const url of [first, second]) {
    await researcher.goto(url);
    await hydrated(researcher);
    await researcher.click("[data-testid=cancel]");
    await researcher.waitForSelector("[data-testid=task-name] [data-testid=state]:text('cancelled')", { timeout: 15000 });
  }
  assert.deepEqual(errors, []);
  await adminCtx.close();
  await researcherCtx.close();
});

test("a node that cannot isolate tasks is trusted-only until opened, then the pages warn", async () => {
  const adminCtx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const admin = await adminCtx.newPage();
  admin.on("dialog", (d) => d.accept());
  const errors = [];
  admin.on("pageerror", (e) => errors.push(String(e)));
  await logIn(admin, server.base, "root@example.com", password);
  await admin.goto(`${server.base}/admin?tab=nodes`);
  await hydrated(admin);
  // An agent that could not sandbox its tasks (not root, no user namespaces) joins.
  const token = await admin.evaluate(async () => {
    const csrf = document.cookie.split("; ").find((c) => c.startsWith("autodl_csrf=")).split("=")[1];
    const res = await fetch("/api/v1/admin/registration-tokens", {
      method: "POST",
      headers: { "content-type": "application/json", "x-csrf-token": csrf },
      body: JSON.stringify({ name: "shared box" }),
    });
    return (await res.json()).token;
  });
  const joined = await fetch(`${server.base}/api/v1/agent/register`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ token, node: { id: "shared-box", cpu: 8, memory: 2 ** 34, gpus: [],
      host: { runtime: "process", isolation: "none", data_roots: [] } } }),
  });
  assert.equal(joined.status, 201);

  // A researcher of another organization sees no warning about it while it is trusted-only.
  const res = await fetch(`${server.base}/api/v1/auth/signup`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ email: "lee@example.com", password, tenant_name: "Other Lab" }),
  });
  assert.equal(res.status, 201);
  const userCtx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const user = await userCtx.newPage();
  user.on("pageerror", (e) => errors.push(String(e)));
  await logIn(user, server.base, "lee@example.com", password);
  await user.goto(`${server.base}/cluster`);
  await hydrated(user);
  await user.waitForSelector("[data-node='shared-box']");
  assert.equal(await user.locator("[data-testid=isolation-notice]:has-text('shared-box')").count(), 0);

  await admin.reload();
  await hydrated(admin);
  const row = "[data-testid=admin-nodes] tr[data-node='shared-box']";
  await admin.waitForSelector(`${row} .badge:text('trusted-only')`);
  await admin.click(`${row} button:text('Open to all')`);
  await admin.waitForSelector(`${row} .badge:text('open to all, unisolated')`);
  await shot(admin, "34-admin-node-unisolated");

  // Now every organization's tasks may land there, and the pages where users look say so.
  await user.reload();
  await hydrated(user);
  await user.waitForSelector("[data-testid=isolation-notice]:has-text('shared-box')", { timeout: 15000 });
  await user.waitForSelector("[data-node='shared-box'] .badge:text('not isolated')");
  await shot(user, "35-cluster-unisolated");
  await user.click("[data-testid=nav-submit]");
  await user.waitForURL("**/submit");
  await user.waitForSelector("[data-testid=isolation-notice]:has-text('shared-box')", { timeout: 15000 });
  assert.deepEqual(errors, []);
  await adminCtx.close();
  await userCtx.close();
});

test("the audit trail shows who did what, filters by kind, and exports", async () => {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const admin = await ctx.newPage();
  const errors = [];
  admin.on("pageerror", (e) => errors.push(String(e)));
  await logIn(admin, server.base, "root@example.com", password);
  await admin.click("[data-testid=nav-audit]");
  await admin.waitForURL("**/audit");
  await hydrated(admin);
  await admin.waitForSelector("[data-testid=audit] tbody tr");
  const all = await admin.locator("[data-testid=audit] tbody tr .badge").allTextContents();
  for (const want of ["auth.sign_in", "member.invited", "member.quota_changed", "node.status_changed"]) {
    assert.ok(all.includes(want), `${want} in ${all}`);
  }

  // Only the nodes: the filter is the page's address, so the view can be shared as a link.
  await admin.selectOption("[data-testid=audit-action]", "node.");
  await admin.click("[data-testid=audit-filter]");
  await admin.waitForURL("**/audit?action=node.*");
  await hydrated(admin);
  await admin.waitForSelector("[data-testid=audit] tbody tr");
  const nodes = await admin.locator("[data-testid=audit] tbody tr .badge").allTextContents();
  assert.ok(nodes.length > 0 && nodes.every((a) => a.startsWith("node.")), String(nodes));
  assert.ok((await admin.textContent("[data-testid=audit]")).includes("\"action\":\"drain\""));
  await shot(admin, "34-audit-trail");

  // The export downloads what the filter shows.
  const href = await admin.getAttribute("[data-testid=audit-csv]", "href");
  assert.ok(href.includes("format=csv") && href.includes("action=node."), href);
  const csv = await admin.evaluate(async (href) => (await fetch(href)).text(), href);
  const lines = csv.trim().split("\n");
  assert.ok(lines[0].startsWith("seq,at,tenant_id"), lines[0]);
  assert.equal(lines.length - 1, nodes.length);

  // A researcher without a managing role is told so.
  const other = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const kai = await other.newPage();
  await logIn(kai, server.base, "kai@example.com", password);
  await kai.goto(`${server.base}/audit`);
  await hydrated(kai);
  await kai.waitForSelector(".banner.error:has-text('owner or admin role')");
  assert.equal(await kai.locator("[data-testid=nav-audit]").count(), 0);
  assert.deepEqual(errors, []);
  await other.close();
  await ctx.close();
});

test("usage over time: organizations for the operator, a member's own for the member", async () => {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 1000 } });
  const admin = await ctx.newPage();
  const errors = [];
  admin.on("pageerror", (e) => errors.push(String(e)));
  await logIn(admin, server.base, "root@example.com", password);
  await admin.click("[data-testid=nav-usage]");
  await admin.waitForURL("**/usage");
  await hydrated(admin);
  await admin.waitForSelector("[data-testid=usage-chart] svg");
  const orgs = await admin.locator("[data-testid=usage-totals] tbody tr td:first-child").allTextContents();
  assert.ok(orgs.length >= 1, String(orgs));
  // The first test's researcher ran tasks in the administrator's organization: its cap is shown.
  await admin.waitForSelector("[data-testid=usage-quotas]");
  // Kai's tasks waited and ran: the scheduler kept his standing.
  await admin.waitForSelector("[data-testid=standing-chart] svg");
  assert.ok((await admin.textContent("[data-testid=standing-chart]")).includes("kai@example.com"));
  await shot(admin, "37-usage-organizations");

  await admin.selectOption("[data-testid=usage-by]", "person");
  await admin.selectOption("[data-testid=usage-bucket]", "week");
  await admin.click("[data-testid=usage-apply]");
  await admin.waitForURL("**/usage?bucket=week*by=person*");
  await hydrated(admin);
  await admin.waitForSelector("[data-testid=usage-totals] td:has-text('kai@example.com')");
  const href = await admin.getAttribute("[data-testid=usage-csv]", "href");
  assert.ok(href.includes("bucket=week"), href);
  const csv = await admin.evaluate(async (href) => (await fetch(href)).text(), href);
  assert.ok(csv.split("\n")[0].startsWith("bucket,start,tenant_id"), csv);
  assert.ok(csv.includes("kai@example.com"));
  await shot(admin, "38-usage-people-weekly");

  const other = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const kai = await other.newPage();
  kai.on("pageerror", (e) => errors.push(String(e)));
  await logIn(kai, server.base, "kai@example.com", password);
  await kai.goto(`${server.base}/usage`);
  await hydrated(kai);
  await kai.waitForSelector("[data-testid=usage-totals] td:has-text('kai@example.com')");
  const people = await kai.locator("[data-testid=usage-totals] tbody tr").count();
  assert.equal(people, 1, "a member sees only themselves");
  assert.deepEqual(errors, []);
  await other.close();
  await ctx.close();
});
