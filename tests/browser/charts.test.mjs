// Charts a researcher reads: a reported metric on its own axis, by time or by step, smoothed,
// values under the pointer, drag to zoom; two tasks compared with what differs between them;
// bulk cancel from the list; times in the viewer's zone; a missing task streams nothing;
// the list and navigation at phone width.
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

const signUp = (ctx, email, tenant) => signUpApi(ctx, server.base, email, password, tenant);

async function submit(ctx, headers, name, command) {
  const r = await ctx.request.post(`${server.base}/api/v1/tasks`, {
    headers,
    data: { name, image: "python:3.12", command, resources: { gpu: { count: 0 } }, labels: { sweep: "lr" } },
  });
  assert.equal(r.status(), 201, await r.text());
  return (await r.json()).id;
}

async function report(ctx, headers, id, n, scale) {
  for (let i = 0; i < n; i++) {
    const r = await ctx.request.post(`${server.base}/api/v1/tasks/${id}/metrics`, {
      headers,
      data: { step: i * 10, loss: scale / (i + 1), val_loss: (scale * 1.2) / (i + 1), accuracy: 0.5 + i / (2 * n), lr: 0.001 },
    });
    assert.equal(r.status(), 204, await r.text());
    await new Promise((res) => setTimeout(res, 5));
  }
}

test("metrics charts, comparing tasks, bulk cancel, local times", async () => {
  // The viewer is in India (UTC+5:30): every time on the page says so.
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 }, timezoneId: "Asia/Kolkata" });
  const csrf = await signUp(ctx, "charts@example.com", "Chart Lab");
  const headers = { "X-CSRF-Token": csrf };
  const a = await submit(ctx, headers, "lr-0.1", "sleep 600");
  const b = await submit(ctx, headers, "lr-0.01", "sleep 601");
  await report(ctx, headers, a, 40, 2.0);
  await report(ctx, headers, b, 40, 3.0);
  const page = await ctx.newPage();
  page.on("dialog", (d) => d.accept());
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));

  await page.goto(`${server.base}/tasks/${a}`);
  await hydrated(page);
  // Each reported number has its own chart (its own axis); the history is whole.
  await page.waitForSelector("[data-testid=chart-metric-loss] svg polyline");
  await page.waitForSelector("[data-testid=chart-metric-accuracy] svg polyline");
  // The loss and the validation loss: 40 points each.
  assert.equal(Number(await page.getAttribute("[data-testid=chart-metric-loss]", "data-points")), 80);
  // Times are the viewer's, with the zone said.
  const created = page.locator("[data-testid=events] time").first();
  assert.match(await created.textContent(), /UTC\+5:30$/);
  assert.match(await created.getAttribute("title"), /^\d{4}-\d\d-\d\dT/);
  assert.match(await page.textContent("[data-testid=chart-metric-loss] figcaption"), /times UTC\+5:30/);

  // By step: the x axis counts steps.
  await page.selectOption("[data-testid=metrics-x]", "step");
  await page.waitForSelector("[data-testid=chart-metric-loss] text.tick:text('step 300')");
  // Ticks fall on round numbers of steps.
  const xticks = await page.locator("[data-testid=chart-metric-loss] text.tick").allTextContents();
  assert.ok(xticks.includes("step 100") && xticks.includes("step 200"), xticks.join("|"));
  // A loss and its validation loss share a panel; counters and constants read as values.
  assert.equal(await page.locator("[data-testid=chart-metric-loss] .legend-item").count(), 2);
  assert.match(await page.textContent("[data-testid=chart-metric-loss] .legend"), /val_loss/);
  assert.equal(await page.locator("[data-testid=chart-metric-val_loss]").count(), 0);
  assert.equal(await page.locator("[data-testid=chart-metric-lr]").count(), 0);
  assert.equal(await page.locator("[data-testid=chart-metric-step]").count(), 0);
  assert.match(await page.textContent("[data-testid=metric-value-lr]"), /lr\s*0\.001/);
  assert.match(await page.textContent("[data-testid=metric-value-step]"), /390/);
  // A log scale shows the decades the loss falls through.
  const linear = await page.locator("[data-testid=chart-metric-loss] text.tick").allTextContents();
  assert.ok(!linear.includes("0.10"), linear.join("|"));
  await page.check("[data-testid=metrics-log]");
  await page.waitForSelector("[data-testid=chart-metric-loss] text.tick:text-is('0.10')");
  await shot(page, "50-charts-log");
  await page.uncheck("[data-testid=metrics-log]");
  // Smoothing draws the raw line faint behind the smoothed one.
  await page.locator("[data-testid=metrics-smoothing]").fill("0.9");
  await page.waitForSelector("[data-testid=chart-metric-loss] polyline[stroke-opacity='0.3']");
  // Hovering shows the values under the pointer.
  const svg = page.locator("[data-testid=chart-metric-loss] svg");
  await svg.scrollIntoViewIfNeeded();
  const box = await svg.boundingBox();
  await page.mouse.move(box.x + box.width * 0.5, box.y + box.height * 0.5);
  await page.waitForSelector("[data-testid=chart-metric-loss] line.cursor", { state: "attached" });
  const hovered = await page.textContent("[data-testid=chart-metric-loss] [data-testid=legend-value]");
  await page.mouse.move(box.x + box.width * 0.97, box.y + box.height * 0.5);
  await page.waitForFunction((v) => document.querySelector("[data-testid=chart-metric-loss] [data-testid=legend-value]")?.textContent !== v, hovered);
  // Dragging across zooms; zooming out shows everything again.
  await page.mouse.move(box.x + box.width * 0.3, box.y + box.height * 0.5);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width * 0.6, box.y + box.height * 0.5, { steps: 5 });
  await page.mouse.up();
  await page.waitForSelector("[data-testid=chart-metric-loss] [data-testid=zoom-out]");
  const zoomed = Number(await page.getAttribute("[data-testid=chart-metric-loss]", "data-points"));
  assert.ok(zoomed > 0 && zoomed < 80, `zoomed shows part: ${zoomed}`);
  await shot(page, "50-charts-zoomed");
  await page.click("[data-testid=chart-metric-loss] [data-testid=zoom-out]");
  await page.waitForFunction(() => Number(document.querySelector("[data-testid=chart-metric-loss]").dataset.points) === 80);
  // A metric can be hidden.
  await page.uncheck("[data-testid=metric-toggle-accuracy]");
  await page.waitForSelector("[data-testid=chart-metric-accuracy]", { state: "detached" });

  // Tick both on the list, compare them: one chart, a line each, and what differs.
  await page.goto(`${server.base}/tasks`);
  await hydrated(page);
  // Each row shows its run's latest losses, then its accuracy.
  assert.match(await page.textContent(`tr[data-task='${a}'] [data-testid=task-metrics]`),
    /loss 0\.05.*val_loss 0\.06.*accuracy 0\.9875/);
  await page.check(`tr[data-task='${a}'] [data-testid=select-task]`);
  await page.check(`tr[data-task='${b}'] [data-testid=select-task]`);
  await page.waitForSelector("[data-testid=selected-count]:text('2 selected')");
  await page.click("[data-testid=compare]");
  await page.waitForURL("**/compare?ids=*");
  await page.waitForSelector("[data-testid=chart-compare] svg polyline");
  assert.equal(await page.locator("[data-testid=chart-compare] .legend-item").count(), 2);
  assert.match(await page.textContent("[data-testid=chart-compare] figcaption"), /loss/);
  const diff = await page.textContent("[data-testid=compare-diff]");
  assert.match(diff, /command/);
  assert.match(diff, /601/);
  assert.ok(!diff.includes("sweep"), "equal labels are not differences");
  await page.selectOption("[data-testid=compare-metric]", "accuracy");
  await page.waitForSelector("[data-testid=chart-compare] figcaption:has-text('accuracy')");
  await shot(page, "51-compare");

  // Cancel both from the list at once: the header box ticks every row on the page, and the
  // cancel asks first.
  await page.goto(`${server.base}/tasks`);
  await hydrated(page);
  const rows = await page.locator("[data-testid=task-row]").count();
  await page.check("[data-testid=select-all]");
  await page.waitForSelector(`[data-testid=selected-count]:text('${rows} selected')`);
  assert.ok(await page.isChecked(`tr[data-task='${a}'] [data-testid=select-task]`));
  await page.uncheck("[data-testid=select-all]");
  await page.waitForSelector("[data-testid=selected-count]:text('Tick tasks')");
  await page.check(`tr[data-task='${a}'] [data-testid=select-task]`);
  await page.check(`tr[data-task='${b}'] [data-testid=select-task]`);
  const asked = [];
  page.on("dialog", (d) => asked.push(d.message()));
  await page.click("[data-testid=cancel-selected]");
  await page.waitForSelector("[data-testid=bulk-message]:text('Cancelled 2 tasks.')");
  assert.deepEqual(asked, ["Cancel 2 selected tasks? Work since their last checkpoint is lost."]);
  await page.waitForFunction(() => [...document.querySelectorAll("[data-testid=task-row] [data-testid=state]")].every((s) => s.textContent === "cancelled"));

  // A task that is not there has no live panels waiting forever.
  await page.goto(`${server.base}/tasks/no-such-task`);
  await hydrated(page);
  await page.waitForSelector("[role=alert]:has-text('no such task')");
  assert.equal(await page.locator("[data-testid=log-status]").count(), 0);
  assert.equal(await page.locator("[data-testid=metrics-status]").count(), 0);

  // At phone width the navigation stays compact and stacked rows keep their labels.
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(`${server.base}/tasks`);
  await hydrated(page);
  const nav = await page.locator(".topbar").boundingBox();
  assert.ok(nav.height <= 110, `the nav is compact: ${nav.height}px`);
  const label = await page.evaluate(() => getComputedStyle(document.querySelector("[data-testid=task-row] td[data-label='State']"), "::before").content);
  assert.match(label, /State/);
  await shot(page, "52-phone-tasks");
  // A chart's ticks stay readable at phone width (the chart is scaled down to fit).
  await page.goto(`${server.base}/tasks/${a}`);
  await hydrated(page);
  await page.waitForSelector("[data-testid=chart-metric-loss] svg text.tick");
  const tickPx = await page.evaluate(() => {
    const t = [...document.querySelectorAll("[data-testid=chart-metric-loss] svg text.tick")].find((e) => e.getBoundingClientRect().height > 0);
    return parseFloat(getComputedStyle(t).fontSize) * (t.ownerSVGElement.getBoundingClientRect().width / 720);
  });
  assert.ok(tickPx >= 10, `ticks are ${tickPx.toFixed(1)} px at phone width`);
  await shot(page, "53-phone-charts");
  assert.deepEqual(errors, []);
  await ctx.close();
});

test("twenty runs compared: a line each, a runs table sorted by a number, columns kept", async () => {
  const ctx = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
  const csrf = await signUp(ctx, "twenty@example.com", "Twenty Lab");
  const headers = { "X-CSRF-Token": csrf };
  const ids = [];
  for (let i = 0; i < 20; i++) {
    const id = await submit(ctx, headers, `run-${i}`, `sleep ${600 + i}`);
    ids.push(id);
    for (let s = 0; s < 4; s++) {
      const r = await ctx.request.post(`${server.base}/api/v1/tasks/${id}/metrics`, {
        headers,
        // Run 13 ends lowest; every run's loss differs in the fourth digit.
        data: { step: s * 10, loss: 1 / (s + 1) + (i === 13 ? -0.1 : i * 0.0007) },
      });
      assert.equal(r.status(), 204, await r.text());
    }
  }
  const page = await ctx.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(`${server.base}/compare?ids=${ids.join(",")}`);
  await hydrated(page);
  await page.waitForSelector("[data-testid=chart-compare] svg polyline");
  assert.equal(await page.locator("[data-testid=chart-compare] .legend-item").count(), 20);
  // Every legend value reads differently.
  const values = await page.locator("[data-testid=chart-compare] [data-testid=legend-value]").allTextContents();
  assert.equal(new Set(values).size, 20, values.join("|"));
  assert.equal(await page.locator("[data-testid=run-row]").count(), 20);
  // Sorted by the loss, lowest first: run 13.
  await page.click("[data-testid=sort-loss]");
  await page.waitForSelector("[data-testid=sort-loss]:has-text('↑')");
  assert.match(await page.textContent("[data-testid=run-row] >> nth=0"), /run-13/);
  await page.click("[data-testid=sort-loss]");
  await page.waitForSelector("[data-testid=sort-loss]:has-text('↓')");
  assert.doesNotMatch(await page.textContent("[data-testid=run-row] >> nth=0"), /run-13/);
  // A hidden column stays hidden on the next visit.
  await page.click("details.columns summary");
  await page.uncheck("[data-testid=column-GPU-h]");
  await page.waitForSelector("[data-testid=sort-GPU-h]", { state: "detached" });
  await shot(page, "54-compare-twenty");
  await page.reload();
  await hydrated(page);
  await page.waitForSelector("[data-testid=run-row]");
  assert.equal(await page.locator("[data-testid=sort-GPU-h]").count(), 0);
  assert.ok(await page.locator("[data-testid=sort-loss]").count() === 1);
  assert.deepEqual(errors, []);
  await ctx.close();
});
