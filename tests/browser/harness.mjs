// Starts a real autodl server (fresh SQLite) and a headless Chromium for one test file.
import { spawn } from "node:child_process";
import { mkdtempSync, mkdirSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const serverBin = process.env.AUTODL_SERVER_BIN;
const siteRoot = process.env.AUTODL_SITE_ROOT;
export const artifacts = process.env.AUTODL_ARTIFACTS || join(process.cwd(), "artifacts");

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/// Starts the server; `args` are its command line (["serve", "--demo"] adds simulated agents,
/// which keep their state in a temporary AUTODL_DEMO_DIR).
export async function startServer(extraEnv = {}, args = ["serve"]) {
  if (!serverBin || !siteRoot) throw new Error("AUTODL_SERVER_BIN and AUTODL_SITE_ROOT must be set (scripts/test.sh sets them)");
  const dir = mkdtempSync(join(tmpdir(), "autodl-browser-"));
  const port = await freePort();
  const child = spawn(serverBin, args, {
    env: {
      ...process.env,
      AUTODL_LISTEN: `127.0.0.1:${port}`,
      AUTODL_DATABASE_URL: `sqlite://${dir}/autodl.db`,
      AUTODL_SITE_ROOT: siteRoot,
      AUTODL_DEMO_DIR: join(dir, "demo-agents"),
      AUTODL_STORAGE_URL: `file://${join(dir, "objects")}`,
      RUST_LOG: "warn",
      ...extraEnv,
    },
    stdio: ["ignore", "inherit", "inherit"],
  });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 100; i++) {
    try {
      const r = await fetch(`${base}/healthz`);
      if (r.ok) return { base, dir, stop: () => child.kill("SIGTERM") };
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  child.kill("SIGKILL");
  throw new Error("server did not start");
}

export async function startBrowser() {
  const userDataDir = mkdtempSync(join(tmpdir(), "autodl-chromium-"));
  mkdirSync(artifacts, { recursive: true });
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: [
      "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
      "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
    ],
  });
  return { browser, userDataDir };
}

// Errors each page reported, kept from the first wait on it: what a failed wait says.
const pageErrors = new WeakMap();
function errorsOf(page) {
  if (!pageErrors.has(page)) {
    const errors = [];
    page.on("pageerror", (e) => errors.push(`pageerror: ${e.message}`));
    page.on("console", (m) => { if (m.type() === "error") errors.push(`console: ${m.text()}`); });
    pageErrors.set(page, errors);
  }
  return pageErrors.get(page);
}

/// Waits until the Leptos app has hydrated the page; if it does not, says which page and what
/// the browser reported, and keeps a screenshot.
export async function hydrated(page) {
  const errors = errorsOf(page);
  try {
    await page.waitForSelector("body[data-hydrated=true]", { timeout: 30000 });
  } catch (e) {
    await shot(page, `failed-hydration-${Date.now()}`).catch(() => {});
    throw new Error(`${page.url()} did not hydrate: ${errors.slice(-5).join(" | ") || "the page reported no error"}\n${e.message}`);
  }
}

export async function shot(page, name) {
  await page.screenshot({ path: join(artifacts, `${name}.png`), fullPage: true });
}

/// Signs in through the login form and waits for the dashboard it lands on.
export async function logIn(page, base, email, password) {
  await page.goto(`${base}/login`);
  await hydrated(page);
  await page.fill("#email", email);
  await page.fill("#password", password);
  await page.click("button[type=submit]");
  await page.waitForURL((u) => new URL(u).pathname === "/");
}

/// Signs up through the API in the browser context `ctx` (so its cookies are the browser's);
/// returns the CSRF token that writes must echo.
export async function signUpApi(ctx, base, email, password, tenant) {
  const r = await ctx.request.post(`${base}/api/v1/auth/signup`, {
    data: { email, password, tenant_name: tenant },
  });
  if (r.status() !== 201) throw new Error(`sign-up failed: ${r.status()} ${await r.text()}`);
  return (await ctx.cookies()).find((c) => c.name === "autodl_csrf").value;
}

/// A JSON API client for scripts outside a browser (benchmarks): `api(method, path, body, token)`.
export function apiClient(base) {
  return async function api(method, path, body, token) {
    const res = await fetch(`${base}${path}`, {
      method,
      headers: { "content-type": "application/json", ...(token ? { authorization: `Bearer ${token}` } : {}) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
    return text ? JSON.parse(text) : null;
  };
}
