// What the console's browser scripts share: their settings from the
// environment, Debian's Chromium, sign-in with a key, screenshots.
import { chromium } from "playwright-core";
import assert from "node:assert/strict";
import path from "node:path";

export const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
export const base = env("FLEETD_URL");
export const tenant = env("FLEETD_TENANT");
const shots = process.env.SCREENSHOTS || "";

export const step = (s) => console.log(`step: ${s}`);

export async function shot(page, name) {
  if (!shots) return;
  await page.screenshot({ path: path.join(shots, `${name}.png`), fullPage: false });
}

export async function signIn(page, key) {
  await page.goto(base + "/");
  assert.match(page.url(), /\/console\/signin/, "an anonymous visit goes to the sign-in page");
  await page.getByLabel("Tenant", { exact: true }).fill(tenant);
  await page.getByLabel("API key").fill(key);
  await page.getByRole("button", { name: "Sign in with API key" }).click();
  await page.waitForURL(base + "/console/");
}

// fitsLayout visits each path at 1280x800 and at phone width (390x844) and
// checks that the page is no wider than the window (wide tables scroll
// inside themselves) and that the first Tab reaches the skip link. The
// page is left at phone width.
export async function fitsLayout(page, paths) {
  for (const [width, height] of [[1280, 800], [390, 844]]) {
    await page.setViewportSize({ width, height });
    for (const p of paths) {
      const res = await page.goto(base + p);
      assert.equal(res.status(), 200, `${p}: status`);
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      if (overflow > 0) {
        // The innermost elements that stick out, to say what to mend.
        const wide = await page.evaluate(() => [...document.querySelectorAll("body *")]
          .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 0.5 &&
            ![...e.children].some((c) => c.getBoundingClientRect().right > window.innerWidth + 0.5))
          .slice(0, 5).map((e) => `<${e.tagName.toLowerCase()}${e.className ? "." + e.className : ""}> ${e.textContent.trim().slice(0, 40)}`));
        assert.fail(`${p} at ${width}px is ${overflow}px wider than the window: ${wide.join(", ")}`);
      }
      // The skip link shows when focused.
      await page.keyboard.press("Tab");
      assert.equal(await page.evaluate(() => document.activeElement?.textContent), "Skip to content", `${p}: the first Tab reaches the skip link`);
    }
  }
}

export function launch() {
  return chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
  });
}

// watchedPage opens a page at 1280x800 that records the dialogs it shows
// (each answered with answer, "dismiss" or "accept") and the
// Content-Security-Policy violations it reports.
export async function watchedPage(browser, answer = "dismiss") {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await ctx.newPage();
  const dialogs = [];
  page.on("dialog", (d) => { dialogs.push(d.message()); d[answer](); });
  const cspViolations = [];
  page.on("console", (m) => { if (/Content Security Policy/i.test(m.text())) cspViolations.push(m.text()); });
  return { ctx, page, dialogs, cspViolations };
}

// run runs steps(browser), prints what the failing page said, and exits
// with the outcome.
export async function run(steps) {
  const browser = await launch();
  let failed = false;
  const pages = [];
  try {
    await steps(browser, (p) => pages.push(p));
    console.log("all steps passed");
  } catch (e) {
    failed = true;
    console.error(e);
    for (const p of pages) {
      console.error(`at ${p.url()}:\n` + (await p.locator("main").innerText().catch(() => "")));
    }
  } finally {
    await browser.close();
  }
  process.exit(failed ? 1 : 0);
}

// call sends a request to fleetd's HTTP API with key and returns the
// status and the decoded body.
export async function call(key, method, p, body) {
  const res = await fetch(base + p, {
    method,
    headers: { "x-service-tenant": tenant, "x-service-api-key": key, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null };
}

// api is call for a request that must succeed.
export async function api(key, method, p, body) {
  const res = await call(key, method, p, body);
  if (res.status >= 300) throw new Error(`${method} ${p}: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body;
}
