// Benchmark (not a test): the delay from a GPU sample reaching the server to the task page's
// utilization chart drawing it, in headless Chromium.
//
//   scripts/bench-chart-delay.sh        (AUTODL_BENCH_SAMPLES, default 100)
//
// A node is registered through the agent API by this script (so it knows when each sample was
// sent), runs one task, and sends one sample at a time at irregular intervals while the page
// watches the chart's SVG with a MutationObserver. Browser and script share the machine clock.
import { execFileSync } from "node:child_process";
import { startServer, startBrowser, hydrated, logIn, apiClient } from "./harness.mjs";

const samples = Number(process.env.AUTODL_BENCH_SAMPLES || 100);
const password = "Bench-passw0rd-1";
const server = await startServer();
const { browser } = await startBrowser();

const api = apiClient(server.base);

try {
  execFileSync(process.env.AUTODL_SERVER_BIN, ["admin", "create-admin", "--email", "ops@example.com", "--password", password], {
    env: { ...process.env, AUTODL_DATABASE_URL: `sqlite://${server.dir}/autodl.db`, RUST_LOG: "warn" },
    stdio: ["ignore", "ignore", "inherit"],
  });
  const op = await api("POST", "/api/v1/auth/login", { email: "ops@example.com", password });
  const reg = await api("POST", "/api/v1/admin/registration-tokens", { name: "bench" }, op.token);
  const gpus = [{ index: 0, type: "A100-40G", uuid: "GPU-bench-0", memory: 42949672960 }];
  const node = await api("POST", "/api/v1/agent/register", {
    token: reg.token,
    // A node that isolates tasks (as a Docker agent does) takes every organization's tasks.
    node: { id: "bench-node", zone: "z1", labels: {}, cpu: 16, memory: 68719476736, gpus,
      host: { runtime: "docker", isolation: "container", data_roots: [] } },
  });
  const cred = node.credential;

  const user = await api("POST", "/api/v1/auth/signup", { email: "ada@example.com", password, tenant_name: "Lab" });
  const task = await api("POST", "/api/v1/tasks", {
    name: "chart-delay", image: "none", command: "sleep 600", resources: { gpu: { count: 1 } },
  }, user.token);

  // Poll as an agent until the task is assigned, report it started, keep polling meanwhile.
  let attempt;
  while (!attempt) {
    const work = await api("POST", "/api/v1/agent/poll?wait=5", { running: [], gpus }, cred);
    attempt = work.assignments?.find((a) => a.task_id === task.id)?.attempt;
  }
  await api("POST", `/api/v1/agent/tasks/${task.id}/started`, { attempt }, cred);
  let polling = true;
  const poller = (async () => {
    while (polling) await api("POST", "/api/v1/agent/poll?wait=5", { running: [{ task_id: task.id, attempt }], gpus }, cred);
  })();

  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await logIn(page, server.base, "ada@example.com", password);
  await page.goto(`${server.base}/tasks/${task.id}`);
  await hydrated(page);
  await page.waitForSelector("[data-testid=chart-util]");
  await page.waitForSelector("[data-testid=metrics-status]:text('live')", { timeout: 15000 });
  await page.evaluate(() => {
    window.__draws = [];
    const el = document.querySelector("[data-testid=chart-util]");
    new MutationObserver(() => window.__draws.push(Date.now()))
      .observe(el, { subtree: true, childList: true, attributes: true, characterData: true });
  });

  const fromSent = [], fromAcked = [];
  for (let i = 0; i < samples; i++) {
    await new Promise((r) => setTimeout(r, 150 + Math.random() * 350));
    const seen = await page.evaluate(() => window.__draws.length);
    const sent = Date.now();
    await api("POST", "/api/v1/agent/metrics", {
      samples: [{ at: new Date().toISOString(), gpu_index: 0, util: 0.3 + 0.6 * Math.random(),
                  mem_used: 1e9 * (1 + (i % 20)), mem_total: 42949672960, task_id: task.id }],
    }, cred);
    const acked = Date.now();
    await page.waitForFunction((n) => window.__draws.length > n, seen, { timeout: 10000, polling: 5 });
    const drawn = await page.evaluate((n) => window.__draws[n], seen);
    fromSent.push(drawn - sent);
    fromAcked.push(drawn - acked);
  }
  polling = false;
  await poller.catch(() => {});

  const stats = (xs) => {
    const s = [...xs].sort((a, b) => a - b);
    const at = (p) => s[Math.min(s.length - 1, Math.floor(s.length * p))];
    return `p50 ${at(0.5)} ms, p95 ${at(0.95)} ms, max ${s[s.length - 1]} ms`;
  };
  console.log(`chart delay over ${samples} samples`);
  console.log(`  from the sample's POST being sent:   ${stats(fromSent)}`);
  console.log(`  from the server acknowledging it:    ${stats(fromAcked)}`);
} finally {
  await browser.close();
  server.stop();
}
