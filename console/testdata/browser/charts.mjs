// Drives a device's charts and Logs tab in Debian's Chromium, as a viewer
// would. TestConsoleChartsInBrowser (cmd/fleetd/console_browser_test.go)
// starts fleetd with a device that has sent nothing yet, and runs this with:
//   FLEETD_URL, FLEETD_TENANT, VIEWER_KEY, ADMIN_KEY (sends the device's
//   points), DEVICE, SCREENSHOTS (optional).
// Every wait is on a condition in the page, bounded by Playwright's timeouts.
import assert from "node:assert/strict";
import { api, base, env, fitsLayout, run, shot, signIn, step, watchedPage } from "./harness.mjs";

const viewerKey = env("VIEWER_KEY");
const adminKey = env("ADMIN_KEY");
const device = env("DEVICE");

const chartOf = (key) => `figure[data-chart="${key}"]`;

await run(async (browser, watch) => {
  const { page, dialogs, cspViolations } = await watchedPage(browser);
  watch(page);
  await signIn(page, viewerKey);

  step("a device that sent nothing says so");
  await page.goto(base + `/console/devices/${device}`);
  const empty = page.getByText("The device has sent no numeric stream data");
  await empty.waitFor();

  step("points arrive: the chart appears and fills without a reload");
  const now = Date.now();
  const points = [];
  // One a minute for half an hour: each minute's average is its point.
  for (let i = 0; i < 30; i++) points.push({ timestamp: now - (30 - i) * 60_000, sequence: i, temp: 20 + (i % 7), state: "ok" });
  await api(adminKey, "POST", `/api/v1/devices/${device}/streams/env`, points);
  await page.locator(chartOf("env/temp")).waitFor();
  await page.waitForFunction((sel) => document.querySelector(sel + " [data-chart-summary]")?.textContent === "Last average 21; lowest 20, highest 26.",
    chartOf("env/temp"));
  assert.ok(await empty.isHidden(), "the empty state went");
  assert.match(await page.locator(chartOf("env/temp") + " path.line").getAttribute("d"), /^M[\d.]+ [\d.]+ (L[\d.]+ [\d.]+ ?)+$/);
  assert.equal(await page.locator(chartOf("env/state")).count(), 0, "a text field is not charted");

  step("the page drawn by the server shows the same chart, and a new point moves it");
  await page.reload();
  const chart = page.locator(chartOf("env/temp"));
  assert.equal(await chart.getByRole("img").getAttribute("aria-label"), "env · temp: Last average 21; lowest 20, highest 26.");
  await api(adminKey, "POST", `/api/v1/devices/${device}/streams/env`, [{ timestamp: Date.now(), sequence: 99, temp: 31.5 }]);
  await page.waitForFunction((sel) => document.querySelector(sel + " [data-chart-summary]")?.textContent === "Last average 31.5; lowest 20, highest 31.5.",
    chartOf("env/temp"));
  assert.equal(await chart.locator("text.ylabel").last().textContent(), "31.5", "the y axis grew to the new highest");
  await chart.scrollIntoViewIfNeeded();
  await shot(page, "device-charts");

  step("the week's chart reads the hour rollups");
  await page.getByRole("link", { name: "Last week" }).click();
  await page.waitForURL(/chart=week$/);
  await page.waitForFunction((sel) => document.querySelector(sel + " path.line")?.getAttribute("d")?.startsWith("M"), chartOf("env/temp"));

  step("the Logs tab shows a line that arrives, as text");
  await page.getByRole("navigation", { name: "Device" }).getByRole("link", { name: "Logs" }).click();
  await page.waitForURL(new RegExp(`/console/devices/${device}/logs$`));
  await page.getByText("No log line in the last hour").waitFor();
  await api(adminKey, "POST", `/api/v1/devices/${device}/streams/logs`, [
    { timestamp: Date.now(), level: "error", tag: "app", message: "<img src=x onerror=alert(1)> fan stalled", line: "fan.c:42" }]);
  const first = page.locator("[data-logs] tbody tr").first();
  await first.getByText("<img src=x onerror=alert(1)> fan stalled").waitFor();
  assert.equal(await first.locator("td.level").textContent(), "error");
  await first.getByText("fan.c:42").waitFor();
  assert.equal(await page.locator("[data-logs] img").count(), 0, "a line's markup is text");

  step("filtered by level, only the lines at it or above arrive");
  await page.getByLabel("Level and above").selectOption("warn");
  await page.getByRole("button", { name: "Filter" }).click();
  await page.waitForURL(/level=warn/);
  await first.getByText("fan stalled", { exact: false }).waitFor();
  await api(adminKey, "POST", `/api/v1/devices/${device}/streams/logs`, [
    { timestamp: Date.now(), level: "info", tag: "app", message: "all quiet" },
    { timestamp: Date.now() + 1, level: "warn", tag: "net", message: "link flapping" }]);
  await first.getByText("link flapping").waitFor();
  assert.equal(await page.getByText("all quiet").count(), 0, "an info line under a warn filter");
  await shot(page, "device-logs");

  step("the charts and the Logs tab fit 1280x800 and 390x844");
  await fitsLayout(page, [`/console/devices/${device}`, `/console/devices/${device}/logs`]);
  assert.deepEqual(dialogs, [], "nothing ran a dialog");
  assert.deepEqual(cspViolations, [], "no Content-Security-Policy violation");
});
