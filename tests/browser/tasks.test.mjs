// A researcher on a `--demo` server (simulated GPUs, tasks run as local processes) submits a
// task through the form, lands on its page, watches the log tail and the GPU charts grow
// without a reload, sees it complete, then finds it in the list, the dashboard and the cluster.
import { test, before, after } from "node:test";
import { execFileSync } from "node:child_process";
import { readFileSync, mkdtempSync, mkdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import assert from "node:assert/strict";
import { startServer, startBrowser, hydrated, shot, logIn } from "./harness.mjs";

let server, browser;
before(async () => {
  server = await startServer({}, ["serve", "--demo"]);
  ({ browser } = await startBrowser());
});
after(async () => {
  await browser?.close();
  server?.stop();
});

const email = "grace@example.com";
const password = "Tr41n-all-the-things";
const steps = 16;

async function signUp(page) {
  await page.goto(`${server.base}/signup`);
  await hydrated(page);
  await page.fill("#email", email);
  await page.fill("#password", password);
  await page.fill("#tenant_name", "Compilers Lab");
  await page.click("button[type=submit]");
  await page.waitForURL((u) => new URL(u).pathname === "/");
}

async function points(page, testid) {
  return Number(await page.getAttribute(`[data-testid=${testid}]`, "data-points"));
}

test("submit through the form, watch logs and charts live, see it complete", async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("dialog", (d) => d.accept());
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await signUp(page);
  await page.evaluate(() => { window.__noReload = 7; });

  // The nav leads to the submit form; GPU types come from the demo nodes.
  await page.click("[data-testid=nav-submit]");
  await page.waitForURL("**/submit");
  await page.waitForSelector("#gpu_type option[value='A100-40G']", { state: "attached" });
  const optionText = await page.textContent("#gpu_type option[value='A100-40G']");
  assert.match(optionText, /4 of 4 free now/);

  // Inline validation from the API: a name is required.
  await page.fill("#image", "pytorch/pytorch:2.1");
  await page.fill("#command", "echo hi");
  await page.click("[data-testid=submit]");
  await page.waitForSelector("#name-error:not(:empty)");
  // Beside the button too, and the field takes the focus (it is far above).
  await page.waitForSelector("[data-testid=submit-field-error]:has-text('name')");
  assert.equal(await page.evaluate(() => document.activeElement?.id), "name");

  // Client-side: env lines must be KEY=value, shown inline before sending.
  await page.fill("#env", "NOT A PAIR");
  await page.waitForSelector("#env ~ .field-error:text('not key=value')");
  await page.fill("#env", "EPOCHS=3");

  await page.fill("#name", "live-demo");
  await page.fill("#command", `for i in $(seq 1 ${steps}); do echo step $i; sleep 1; done; echo "trained ${steps} steps" > "$AUTODL_RESULTS_DIR/summary.txt"`);
  await page.selectOption("#gpu_type", "A100-40G");
  await page.fill("#gpu_count", "1");
  await page.fill("#labels", "team=compilers");
  // Saved as a template in this browser, picked again later.
  await page.fill("#template", "counting");
  await page.click("[data-testid=save-template]");
  await page.waitForSelector("#template-pick option[value='counting']", { state: "attached" });
  // The snippets follow the form.
  await page.waitForSelector("[data-testid=python-snippet]:text('live-demo')");
  const py = await page.textContent("[data-testid=python-snippet]");
  assert.match(py, /autodl\.Client\(\)\.submit_task\(/);
  assert.match(py, /"team": "compilers"/);
  const yaml = await page.textContent("[data-testid=yaml-snippet]");
  assert.match(yaml, /name: "live-demo"/);
  await shot(page, "10-submit");

  // Rarely used fields are folded under "Advanced"; an error about one of them opens it.
  assert.equal(await page.isVisible("#deadline"), false, "the deadline is under Advanced");
  await page.click("[data-testid=advanced] > summary");
  await page.fill("#deadline", "someday");
  await page.click("[data-testid=advanced] > summary");
  assert.equal(await page.isVisible("#deadline"), false, "folded again");
  await page.click("[data-testid=submit]");
  await page.waitForSelector("#deadline ~ .field-error:not(:empty)", { timeout: 10000 });
  assert.equal(await page.isVisible("#deadline"), true, "opened for its error");
  await page.fill("#deadline", "");

  // A time limit is typed as people say it; one the server cannot read is named at its field.
  await page.fill("#time_limit", "soon");
  await page.click("[data-testid=submit]");
  await page.waitForSelector("#time_limit ~ .field-error:text('not a length of time')", { timeout: 10000 });
  await page.fill("#time_limit", "2h30m");
  await page.click("[data-testid=submit]");
  await page.waitForURL(/\/tasks\/[0-9a-f-]+$/);
  const taskUrl = page.url();
  await page.waitForSelector("[data-testid=task-name]:text('live-demo')");
  await page.waitForSelector("[data-testid=time-limit]:text('2h 30m')");

  // The log tail gains lines and the utilization chart gains points, live.
  await page.waitForSelector("[data-testid=log] .log-line:text('step 2')", { timeout: 30000 });
  const firstLines = await page.locator("[data-testid=log] .log-line").count();
  await page.waitForFunction(
    (n) => document.querySelectorAll("[data-testid=log] .log-line").length > n,
    firstLines, { timeout: 20000 });
  await page.waitForFunction(
    () => Number(document.querySelector("[data-testid=chart-util]")?.dataset.points) > 0,
    null, { timeout: 30000 });
  const firstPoints = await points(page, "chart-util");
  await page.waitForFunction(
    (n) => Number(document.querySelector("[data-testid=chart-util]")?.dataset.points) > n,
    firstPoints, { timeout: 30000 });
  assert.ok(await points(page, "chart-mem") > 0, "memory chart has points");
  await page.waitForSelector("[data-testid=chart-util] svg polyline");
  await page.waitForSelector("[data-testid=chart-util] text:text('%')", { state: "attached" });
  await shot(page, "11-task-running");

  // Log search filters the lines.
  await page.fill("[data-testid=log-search]", "step 1");
  await page.waitForFunction(() => [...document.querySelectorAll("[data-testid=log] .log-line")]
    .every((l) => l.textContent.includes("step 1")));
  await page.fill("[data-testid=log-search]", "");

  // It completes; the stream ends; the attempt is listed with its exit.
  await page.waitForSelector("[data-testid=task-name] [data-testid=state]:text('completed')", { timeout: 60000 });
  await page.waitForSelector(`[data-testid=log] .log-line:text('step ${steps}')`);
  // Each line carries its time; the whole log downloads as text.
  assert.match(await page.textContent("[data-testid=log] .log-line .log-time"), /^\d\d:\d\d:\d\d /);
  const [logFile] = await Promise.all([page.waitForEvent("download"), page.click("[data-testid=log-download]")]);
  assert.match(logFile.suggestedFilename(), /-log\.txt$/);
  assert.match(readFileSync(await logFile.path(), "utf8"), new RegExp(`attempt 1 stdout: step ${steps}`));
  await page.waitForSelector("[data-testid=ran-for]");
  await page.waitForSelector("[data-testid=log-status]:text('ended')", { timeout: 15000 });
  await page.waitForSelector("[data-testid=metrics-status]:text('ended')", { timeout: 15000 });
  await page.waitForSelector("[data-testid=attempts] td:text('succeeded')");
  await page.waitForSelector("[data-testid=events] .badge:text('completed')");
  assert.equal(await page.evaluate(() => window.__noReload), 7, "the task page must update without a reload");

  await page.waitForSelector("[data-testid=checkpoints] td:has-text('No checkpoints saved')");
  // The results the task wrote download as a tar archive.
  const [download] = await Promise.all([page.waitForEvent("download"), page.click("[data-testid=download]")]);
  assert.match(download.suggestedFilename(), /-results\.tar$/);
  const tar = readFileSync(await download.path());
  assert.equal(tar.subarray(0, 11).toString(), "summary.txt");
  assert.match(tar.toString("latin1"), new RegExp(`trained ${steps} steps`));
  // Or one file at a time.
  await page.waitForSelector("[data-testid=result-files] a:text('summary.txt')");
  const [one] = await Promise.all([page.waitForEvent("download"), page.click("[data-testid=result-files] a:text('summary.txt')")]);
  assert.equal(one.suggestedFilename(), "summary.txt");
  assert.match(readFileSync(await one.path(), "utf8"), new RegExp(`trained ${steps} steps`));
  await shot(page, "12-task-completed");

  // Retry submits the same spec again as a new task; cancel that one at once.
  await page.click("[data-testid=retry]");
  await page.waitForURL((u) => u.href !== taskUrl && /\/tasks\/[0-9a-f-]+$/.test(u.pathname));
  await page.waitForSelector("[data-testid=task-name]:text('live-demo')");
  await page.waitForSelector("[data-testid=cancel]");
  assert.equal(await page.locator("[data-testid=retry]").count(), 0, "a task that has not finished offers no retry");
  await page.click("[data-testid=cancel]");
  await page.waitForSelector("[data-testid=task-name] [data-testid=state]:text('cancelled')", { timeout: 15000 });
  assert.equal(await page.evaluate(() => window.__noReload), 7, "retry navigates without a reload");
  // A task without results offers none to download.
  await page.waitForSelector("[data-testid=task-number]");
  assert.equal(await page.locator("[data-testid=download]").count(), 0, "no results, no download button");

  // The list shows it; filters narrow it down.
  await page.goto(`${server.base}/tasks`);
  await hydrated(page);
  await page.waitForSelector("[data-testid=task-row] a:text('live-demo')");
  await page.selectOption("[data-testid=filter-state]", "failed");
  await page.waitForSelector("[data-testid=no-tasks]");
  await page.selectOption("[data-testid=filter-state]", "completed");
  await page.waitForSelector("[data-testid=task-row] a:text('live-demo')");
  await page.fill("[data-testid=filter-label]", "team=other");
  await page.press("[data-testid=filter-label]", "Enter");
  await page.waitForSelector("[data-testid=no-tasks]");
  await page.fill("[data-testid=filter-label]", "team=compilers");
  await page.press("[data-testid=filter-label]", "Enter");
  await page.waitForSelector("[data-testid=task-row] a:text('live-demo')");
  await page.fill("[data-testid=filter-search]", "nothing-like-this");
  await page.waitForSelector("[data-testid=no-tasks]");
  await page.fill("[data-testid=filter-search]", "LIVE");
  await page.waitForSelector("[data-testid=task-row] a:text('live-demo')");
  await shot(page, "13-tasks");
  // The filters are in the URL: a reload (or a shared link) shows the same list.
  const listed = new URL(page.url());
  assert.equal(listed.searchParams.get("state"), "completed");
  assert.equal(listed.searchParams.get("label"), "team=compilers");
  assert.equal(listed.searchParams.get("q"), "LIVE");
  await page.reload();
  await hydrated(page);
  assert.equal(await page.locator("[data-testid=filter-state]").inputValue(), "completed");
  assert.equal(await page.locator("[data-testid=filter-label]").inputValue(), "team=compilers");
  await page.waitForSelector("[data-testid=task-row] a:text('live-demo')");
  // Back shows the earlier filter in the box as well as in the list.
  await page.fill("[data-testid=filter-label]", "team=other");
  await page.press("[data-testid=filter-label]", "Enter");
  await page.waitForSelector("[data-testid=no-tasks]");
  await page.goBack();
  await page.waitForSelector("[data-testid=task-row] a:text('live-demo')");
  assert.equal(await page.locator("[data-testid=filter-label]").inputValue(), "team=compilers");

  // Clone prefills the form from the task.
  await page.goto(taskUrl);
  await hydrated(page);
  await page.click("[data-testid=clone]");
  await page.waitForURL("**/submit?from=*");
  await page.waitForFunction(() => document.querySelector("#name")?.value === "live-demo (copy)");
  assert.match(await page.inputValue("#command"), /seq 1 16/);
  assert.equal(await page.inputValue("#labels"), "team=compilers");

  // A fresh form starts from the saved template.
  await page.goto(`${server.base}/submit`);
  await hydrated(page);
  await page.waitForSelector("#template-pick option[value='counting']", { state: "attached" });
  await page.selectOption("#template-pick", "counting");
  await page.waitForFunction(() => document.querySelector("#name")?.value === "live-demo");
  assert.match(await page.inputValue("#command"), /seq 1 16/);
  assert.equal(await page.inputValue("#gpu_type"), "A100-40G");

  // Dashboard and cluster.
  await page.goto(`${server.base}/`);
  await hydrated(page);
  await page.waitForSelector("[data-testid=fair-share]:text('Nothing of yours is waiting')");
  await shot(page, "14-dashboard");
  await page.goto(`${server.base}/cluster`);
  await hydrated(page);
  await page.waitForSelector("[data-testid=cluster-summary]");
  assert.equal(await page.locator("[data-testid=gpu-cell]").count(), 8);
  await shot(page, "15-cluster");

  assert.deepEqual(errors, []);
  await page.close();
});

async function submitThroughForm(page, name, command, gpuType, count) {
  await page.click("[data-testid=nav-submit]");
  await page.waitForURL("**/submit");
  await page.waitForSelector(`#gpu_type option[value='${gpuType}']`, { state: "attached" });
  await page.fill("#name", name);
  await page.fill("#command", command);
  await page.selectOption("#gpu_type", gpuType);
  await page.fill("#gpu_count", String(count));
  await page.click("[data-testid=submit]");
  await page.waitForURL(/\/tasks\/[0-9a-f-]+$/);
  await page.waitForSelector(`[data-testid=task-name]:text('${name}')`);
  return page.url();
}

test("a waiting task says why; the dashboard and cluster show the load; cancel frees it", async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("dialog", (d) => d.accept());
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await logIn(page, server.base, email, password);

  const first = await submitThroughForm(page, "big-one", "sleep 120", "A100-40G", 4);
  await page.waitForSelector("[data-testid=task-name] [data-testid=state]:text('running')", { timeout: 30000 });
  const second = await submitThroughForm(page, "big-two", "sleep 120", "A100-40G", 4);
  await page.waitForSelector("[data-testid=waiting]", { timeout: 15000 });
  await page.waitForSelector("[data-testid=priority] .bar-row", { timeout: 15000 });
  // The scheduler's forecast says when it should start (the first runs an hour by default).
  await page.waitForSelector("[data-testid=estimated-start] strong:text-matches('^[0-9]{4}-[0-9]{2}-[0-9]{2} ')", { timeout: 30000 });
  assert.ok((await page.textContent("[data-testid=waiting]")).length > 20);
  await shot(page, "18-task-waiting");

  await page.click("[data-testid=nav-cluster]");
  await page.waitForSelector("[data-testid=cluster-summary]:has-text('4 of 8')", { timeout: 15000 });
  assert.equal(await page.locator("[data-node=demo-a100] [data-testid=gpu-cell][data-tasks='1']").count(), 4);
  await shot(page, "19-cluster-busy");

  await page.click("a.brand");
  await page.waitForSelector("[data-testid=waiting-count]:text('1')");
  await page.waitForSelector("[data-testid=dash-waiting] a:text('big-two')");
  await page.waitForSelector("[data-testid=fair-share]:has-text('fair-share factor')", { timeout: 15000 });
  await shot(page, "20-dashboard-busy");

  for (const url of [second, first]) {
    await page.goto(url);
    await hydrated(page);
    await page.click("[data-testid=cancel]");
    await page.waitForSelector("[data-testid=task-name] [data-testid=state]:text('cancelled')", { timeout: 15000 });
  }
  await page.goto(`${server.base}/cluster`);
  await hydrated(page);
  await page.waitForSelector("[data-testid=cluster-summary]:has-text('0 of 8')", { timeout: 30000 });
  assert.deepEqual(errors, []);
  await page.close();
});

test("pages fit a phone screen", async () => {
  const ctx = await browser.newContext({ viewport: { width: 390, height: 844 } });
  const page = await ctx.newPage();
  await logIn(page, server.base, email, password);
  for (const [path, sel] of [["/tasks", "[data-testid=task-row]"], ["/submit", "#name"], ["/cluster", "[data-testid=heatmap]"], ["/", "[data-testid=fair-share]"]]) {
    await page.goto(`${server.base}${path}`);
    await hydrated(page);
    await page.waitForSelector(sel);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 1, `${path} overflows by ${overflow}px at 390px`);
    await shot(page, `16-mobile${path === "/" ? "-home" : path.replace(/\//g, "-")}`);
  }
  await ctx.close();
});

test("a project uploaded with the form is where the task runs", async () => {
  const dir = mkdtempSync(join(tmpdir(), "autodl-code-"));
  mkdirSync(join(dir, "project", "conf"), { recursive: true });
  writeFileSync(join(dir, "project", "run.sh"), "echo running with $(cat conf/lr.txt) in $(basename $(pwd))\n");
  writeFileSync(join(dir, "project", "conf", "lr.txt"), "lr=3e-4");
  execFileSync("tar", ["czf", join(dir, "project.tar.gz"), "-C", join(dir, "project"), "."]);
  writeFileSync(join(dir, "notes.txt"), "not an archive");
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await logIn(page, server.base, email, password);
  await page.goto(`${server.base}/submit`);
  await hydrated(page);
  // Something that is not an archive is refused at the field, with the server's reason.
  await page.setInputFiles("#code_upload", join(dir, "notes.txt"));
  await page.waitForSelector("#code_upload ~ .field-error:text('not a .tar.gz, .tar or .zip')");
  await page.setInputFiles("#code_upload", join(dir, "project.tar.gz"));
  await page.waitForSelector("[data-testid=code-note]:text('Uploaded: 2 files')");
  await page.fill("#name", "with-code");
  await page.fill("#command", "sh run.sh");
  await page.fill("#gpu_count", "1");
  await shot(page, "19-submit-with-code");
  await page.click("[data-testid=submit]");
  await page.waitForURL(/\/tasks\/[0-9a-f-]+$/);
  await page.waitForSelector("[data-testid=task-name] [data-testid=state]:text('completed')", { timeout: 60000 });
  await page.waitForSelector("[data-testid=log] .log-line:text('running with lr=3e-4 in code')");
  assert.deepEqual(errors, []);
});

test("a sweep's page shows its trials' parameters and metrics, sorts them, and cancels them all", async () => {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await ctx.newPage();
  page.on("dialog", (d) => d.accept());
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await logIn(page, server.base, email, password);
  const csrf = (await ctx.cookies()).find((c) => c.name === "autodl_csrf").value;
  const post = async (path, data) => {
    const r = await ctx.request.post(`${server.base}${path}`, { data, headers: { "X-CSRF-Token": csrf } });
    assert.ok(r.ok(), `${path}: ${r.status()} ${await r.text()}`);
    return r.json();
  };
  const template = { name: "t", image: "none", command: "echo lr=${lr}", resources: { gpu: { count: 1 } } };
  const done = await post("/api/v1/sweeps", { name: "lr-search", template, parameters: { lr: [0.1, 0.01, 0.001] }, max_concurrency: 2 });
  const held = await post("/api/v1/sweeps", { name: "held", template: { ...template, command: "sleep ${secs}" },
    parameters: { secs: [300, 301, 302, 303] }, max_concurrency: 1 });

  await page.click("[data-testid=nav-sweeps]");
  await page.waitForURL("**/sweeps");
  await hydrated(page);
  await page.waitForSelector("[data-testid=sweep-row] a:text('lr-search')");
  await page.click("[data-testid=sweep-row] a:text('lr-search')");
  await page.waitForURL(`**/sweeps/${done.id}`);
  await page.waitForSelector("[data-testid=sweep-summary]:text('3 completed')", { timeout: 60000 });
  // The newest reported numbers become columns.
  for (const [i, loss] of [[0, 0.9], [1, 0.2], [2, 0.5]]) {
    const r = await ctx.request.post(`${server.base}/api/v1/tasks/${done.items[i].task_id}/metrics`,
      { data: { loss, epoch: 3 }, headers: { "X-CSRF-Token": csrf } });
    assert.equal(r.status(), 204);
  }
  await page.waitForSelector("[data-testid=sweep-trials] th:has-text('loss')", { timeout: 15000 });
  await page.waitForSelector("[data-testid=trial-row] td:text('0.9')");
  await page.click("[data-testid=sweep-trials] th button:has-text('loss')");
  const order = await page.$$eval("[data-testid=trial-row]", (rows) => rows.map((r) => r.dataset.trial));
  assert.deepEqual(order, ["1", "2", "0"], "sorted by loss, lowest first");
  assert.match(await page.getAttribute("[data-testid=sweep-compare]", "href"),
    new RegExp(`/compare\\?ids=${done.items[1].task_id},${done.items[2].task_id},${done.items[0].task_id}`));
  // Parallel coordinates: a line per trial from lr to the loss, the best blue, the worst orange.
  await page.waitForSelector("[data-testid=sweep-parallel] polyline", { state: "attached" });
  assert.equal(await page.locator("[data-testid=sweep-parallel] polyline").count(), 3);
  assert.equal(await page.getAttribute("[data-testid=sweep-parallel] polyline[data-trial='1']", "stroke"), "#1c7ed6");
  assert.equal(await page.getAttribute("[data-testid=sweep-parallel] polyline[data-trial='0']", "stroke"), "#e8590c");
  await shot(page, "20-sweep");

  // The held sweep runs one trial at a time; one click cancels all four.
  await page.goto(`${server.base}/sweeps/${held.id}`);
  await hydrated(page);
  await page.waitForSelector("[data-testid=sweep-summary]:text('1 running')", { timeout: 30000 });
  await page.waitForSelector("[data-testid=sweep-summary]:text('3 pending')");
  await page.click("[data-testid=sweep-cancel]");
  await page.waitForSelector("[data-testid=sweep-summary]:text('4 cancelled')", { timeout: 30000 });

  // An ASHA sweep stops the trial behind at its first rung, and its page says so and why.
  const asha = await post("/api/v1/sweeps", { name: "asha", method: "asha", metric: "loss", max_resource: 9,
    template: { ...template, command: "sleep 300 # ${q}" }, parameters: { q: [1, 2] } });
  for (const [i, loss] of [[0, 1.5], [1, 2.5]]) {
    const r = await ctx.request.post(`${server.base}/api/v1/tasks/${asha.items[i].task_id}/metrics`,
      { data: { step: 1, loss }, headers: { "X-CSRF-Token": csrf } });
    assert.equal(r.status(), 204);
  }
  await page.goto(`${server.base}/sweeps/${asha.id}`);
  await hydrated(page);
  await page.waitForSelector("[data-testid=sweep-objective]:text('Optimises loss (lower is better)')");
  await page.waitForSelector("[data-testid=sweep-asha]:has-text('1 stopped so far')");
  const why = await page.getAttribute("[data-testid=trial-row][data-trial='1'] [data-testid=stopped-early]", "title");
  assert.match(why, /loss 2\.5 at step 1/);
  assert.equal(await page.locator("[data-testid=trial-row][data-trial='0'] [data-testid=stopped-early]").count(), 0);
  await shot(page, "20-sweep-asha");
  await page.click("[data-testid=sweep-cancel]");
  await page.waitForSelector("[data-testid=sweep-summary]:text('2 cancelled')", { timeout: 30000 });
  assert.deepEqual(errors, []);
  await ctx.close();
});

test("the new pages render on the server before hydration", async () => {
  for (const path of ["/tasks", "/tasks/00000000-0000-0000-0000-000000000000", "/submit", "/cluster", "/sweeps", "/sweeps/nope"]) {
    const res = await fetch(`${server.base}${path}`);
    assert.equal(res.status, 200, path);
    const html = await res.text();
    assert.ok(html.includes('<a class="brand" href="/">autodl</a>'), `${path} has the layout`);
  }
});

test("a platform administrator sees the month's GPU usage and downloads it as CSV", async () => {
  // The CLI makes the first administrator in the same database.
  execFileSync(process.env.AUTODL_SERVER_BIN, ["admin", "create-admin", "--email", "ops@example.com", "--password", password], {
    env: { ...process.env, AUTODL_DATABASE_URL: `sqlite://${server.dir}/autodl.db`, RUST_LOG: "warn" },
    stdio: ["ignore", "ignore", "inherit"],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("dialog", (d) => d.accept());
  await logIn(page, server.base, "ops@example.com", password);
  await page.click("a:text('Admin')");
  await page.waitForURL("**/admin");
  await page.click("[data-testid=tab-usage]");
  await page.waitForSelector("[data-testid=usage-users] td:text('grace@example.com')");
  await page.waitForSelector("[data-testid=usage-tenants] td:text('Compilers Lab')");
  const href = await page.getAttribute("[data-testid=usage-csv]", "href");
  assert.match(href, /format=csv/);
  const csv = await page.evaluate(async (h) => (await fetch(h)).text(), href);
  assert.match(csv, /^month,tenant_id,tenant,user_id,user,attempts,gpu_hours,avg_utilization/);
  assert.match(csv, /"grace@example.com",\d+,/);
  // Another month is empty.
  await page.fill("[data-testid=usage-month]", "2001-01");
  await page.waitForSelector("[data-testid=usage-users] td:text('No GPU use this month.')");
  await shot(page, "17-admin-usage");
  await page.close();
});
