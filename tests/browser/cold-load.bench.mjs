// Benchmark (not a test): how soon pages show their data and become interactive in headless
// Chromium, cold (a fresh profile: nothing cached) and warm (the same profile again), with
// AUTODL_BENCH_TASKS tasks (default 10,000) in the researcher's organization.
//
//   scripts/bench-cold-load.sh
//
// "content" is when the page's data is on screen (the first contentful paint: pages arrive
// rendered with their data), "interactive" when hydration has finished (body[data-hydrated]).
import { startServer, startBrowser, apiClient } from "./harness.mjs";

const tasks = Number(process.env.AUTODL_BENCH_TASKS || 10000);
const runs = Number(process.env.AUTODL_BENCH_RUNS || 5);
const password = "Bench-passw0rd-1";
const server = await startServer();
const { browser } = await startBrowser();

const api = apiClient(server.base);

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

try {
  const me = await api("POST", "/api/v1/auth/signup", { email: "bench@example.com", password, tenant_name: "Bench Lab" });
  let first = null;
  for (let i = 0; i < tasks; i += 50) {
    const batch = await Promise.all(Array.from({ length: Math.min(50, tasks - i) }, (_, k) =>
      api("POST", "/api/v1/tasks", { name: `bench-${i + k}`, image: "python:3.12", command: "sleep 60", resources: { gpu: { count: 1 } } }, me.token)));
    first ??= batch[0].id;
  }
  const pages = { dashboard: "/", tasks: "/tasks", "task page": `/tasks/${first}` };
  const wasm = await fetch(`${server.base}/pkg/autodl_bg.wasm`);
  const wasmBytes = (await wasm.arrayBuffer()).byteLength;
  console.log(`${tasks} tasks; wasm served: ${(wasmBytes / 1e6).toFixed(1)} MB uncompressed`);
  console.log(`${"page".padEnd(10)} ${"cold content".padStart(13)} ${"cold interactive".padStart(17)} ${"warm content".padStart(13)} ${"warm interactive".padStart(17)}`);
  for (const [name, path] of Object.entries(pages)) {
    const cold = { content: [], interactive: [] };
    const warm = { content: [], interactive: [] };
    for (let r = 0; r < runs; r++) {
      const ctx = await browser.newContext();
      await ctx.addCookies([{ name: "autodl_session", value: me.token, url: server.base }]);
      for (const into of [cold, warm]) {
        const page = await ctx.newPage();
        const start = Date.now();
        await page.goto(`${server.base}${path}`, { waitUntil: "commit" });
        await page.waitForSelector("body[data-hydrated=true]", { timeout: 60000 });
        const interactive = Date.now() - start;
        const fcp = await page.evaluate(() => performance.getEntriesByName("first-contentful-paint")[0]?.startTime ?? NaN);
        into.content.push(fcp);
        into.interactive.push(interactive);
        await page.close();
      }
      await ctx.close();
    }
    const f = (x) => `${Math.round(median(x))} ms`.padStart(13);
    console.log(`${name.padEnd(10)} ${f(cold.content)} ${f(cold.interactive).padStart(17)} ${f(warm.content)} ${f(warm.interactive).padStart(17)}`);
  }
} finally {
  await browser.close();
  server.stop();
}
