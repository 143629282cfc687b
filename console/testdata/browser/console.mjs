// Drives fleetd's web console in Debian's Chromium, as an operator and a
// viewer would. TestConsoleInBrowser (cmd/fleetd/console_browser_test.go)
// starts fleetd, provisions the devices and keys, and runs this with:
//   FLEETD_URL, FLEETD_TENANT, OPERATOR_KEY, VIEWER_KEY, DEVICES (comma-separated ids),
//   XSS_DEVICE (a device whose metadata holds markup), SCREENSHOTS (a directory, optional),
//   SIM_PREFIX, SIM_DEVICES (the ids' prefix and number of `fleetd sim` devices, half failing),
//   OIDC_USER, OIDC_PASSWORD, OIDC_EMAIL (a person at the tenant's OpenID provider).
// Every wait is on a condition in the page, bounded by Playwright's timeouts.
import assert from "node:assert/strict";
import { base, env, fitsLayout, launch, shot, signIn, step, tenant, watchedPage } from "./harness.mjs";

const operatorKey = env("OPERATOR_KEY");
const viewerKey = env("VIEWER_KEY");
const devices = env("DEVICES").split(",");
const xssDevice = env("XSS_DEVICE");
const simPrefix = env("SIM_PREFIX");
const simDevices = Number(env("SIM_DEVICES"));

// api calls fleetd's HTTP API as the operator: the test's devices report
// through it (S10), as gateways do.
async function api(method, p, body) {
  const res = await fetch(base + p, {
    method,
    headers: { "x-service-tenant": tenant, "x-service-api-key": operatorKey, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (res.status >= 300) throw new Error(`${method} ${p}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

async function report(actionID, device, state, progress, errors) {
  await api("POST", "/api/v1/devices/action/status", { device_id: device, action_id: actionID, state, progress, errors });
}

const browser = await launch();
let failed = false;
let page;
try {
  const watched = await watchedPage(browser);
  const { ctx, dialogs, cspViolations } = watched;
  page = watched.page;

  step("a wrong key is refused with a message, and the key never reaches a URL");
  await page.goto(base + "/console/signin");
  await shot(page, "signin");
  await page.getByLabel("Tenant", { exact: true }).fill(tenant);
  await page.getByLabel("API key").fill("fk_wrong");
  await page.getByRole("button", { name: "Sign in with API key" }).click();
  await page.getByRole("alert").getByText("do not match").waitFor();
  assert.ok(!page.url().includes("fk_"), "no key in the URL");

  step("sign in with the operator's key");
  await signIn(page, operatorKey);
  await page.getByText("operator", { exact: true }).waitFor();
  const cookies = await ctx.cookies();
  const session = cookies.find((c) => c.name === "fleetd_console");
  assert.ok(session && session.httpOnly && session.sameSite === "Lax", "the session cookie is HttpOnly and SameSite=Lax");
  assert.ok(!session.value.includes(operatorKey), "the cookie does not show the key");

  step("devices: search, and markup in metadata renders as text");
  await page.getByRole("navigation").getByRole("link", { name: "Devices", exact: true }).click();
  await page.getByText(`${devices.length + 1 + simDevices} devices`).waitFor();
  await page.getByText("<script>alert(1)</script>").first().waitFor();
  assert.deepEqual(dialogs, [], "no script from a device's metadata ran");
  await shot(page, "devices");
  await page.getByLabel("Search id or metadata").fill(xssDevice);
  await page.getByRole("button", { name: "Filter" }).click();
  await page.getByText("1 device", { exact: true }).waitFor();
  await page.getByRole("link", { name: xssDevice }).click();
  await page.getByRole("heading", { name: `Device ${xssDevice}` }).waitFor();

  step("dispatch a phased rollout from the form, counting the devices first");
  await page.goto(base + "/console/actions/new");
  await page.getByLabel("Action", { exact: true }).fill("reboot");
  await page.getByLabel("Params (a JSON object the devices receive)").fill('{"delay": 5}');
  await page.getByLabel("Select by").selectOption("default");
  await page.getByLabel(/^Device ids/).fill(devices.join(" "));
  await page.getByLabel("Release in phases").check();
  await page.getByLabel("phase 0 name").fill("canary");
  await page.getByLabel("phase 0 percentage, device ids, metadata or group").fill("50");
  await page.getByLabel("phase 1 name").fill("everyone");
  await page.getByLabel("phase 1 percentage, device ids, metadata or group").fill("100");
  await page.getByLabel("phase 1 trigger").selectOption("after_previous");
  await page.getByLabel("phase 1 gate max failed percent").fill("0");
  await page.getByRole("button", { name: "Count matching devices" }).click();
  await page.getByRole("status").getByText(`${devices.length} devices match this selection now.`).waitFor();
  await shot(page, "dispatch");
  await page.getByRole("button", { name: "Dispatch", exact: true }).click();
  await page.waitForURL(/\/console\/actions\/\d+$/);
  const actionID = Number(page.url().split("/").pop());
  await page.getByRole("heading", { name: /^Rollout/ }).waitFor();

  step("devices report; the page follows without reloading");
  await page.evaluate(() => { window.__sameDocument = true; });
  const das = (await api("GET", `/api/v1/actions/${actionID}/devices?limit=100`)).device_actions;
  const canary = das.filter((d) => d.action_status !== "Scheduled").map((d) => d.device_id);
  const rest = das.filter((d) => d.action_status === "Scheduled").map((d) => d.device_id);
  assert.equal(canary.length, devices.length / 2, "the canary phase released half the devices");
  await report(actionID, canary[0], "Downloading", 40);
  await page.waitForFunction(() => document.querySelector('td[data-count="Progress"]:not([data-phase])')?.textContent === "1");
  await report(actionID, canary[0], "Completed", 100);
  await report(actionID, canary[1], "Failed", 70, ["disk full"]);
  step("the gate stops the rollout and the page says why");
  await page.locator("[data-rollout-status]").getByText("paused").waitFor();
  await page.locator("[data-pause-reason]").waitFor({ state: "visible" });
  // The pause reason numbers the phases as the phase table does, from 0.
  assert.match(await page.locator("[data-pause-reason]").textContent(), /^phase 1 \(everyone\) not released: /);
  await page.getByRole("cell", { name: "1 everyone" }).waitFor();
  assert.equal(await page.evaluate(() => window.__sameDocument), true, "the page was not reloaded");
  await page.getByRole("button", { name: "Resume" }).waitFor();
  await shot(page, "action-paused");

  step("resume; the second phase is released and finishes");
  await page.getByRole("button", { name: "Resume" }).click();
  await page.locator("[data-rollout-status]").getByText("running").waitFor();
  await page.evaluate(() => { window.__sameDocument = true; });
  await page.waitForFunction(() => document.querySelector('[data-triggered="1"]')?.textContent === "released");
  for (const d of rest) await report(actionID, d, "Completed", 100);
  await page.locator("[data-rollout-status]").getByText("completed").waitFor();
  await page.waitForFunction(() => document.querySelector("[data-percent]")?.textContent === "100");
  assert.equal(await page.evaluate(() => window.__sameDocument), true, "the page was not reloaded");
  await page.getByText("disk full").waitFor(); // the failed devices' errors (rendered on resume's reload)
  await shot(page, "action");

  step("the overview follows the fleet live: an action dispatched through the API appears and moves as simulated devices report");
  await page.goto(base + "/console/");
  await page.getByRole("heading", { name: "Actions in flight" }).waitFor();
  await page.locator('[data-live="online"]').getByText(String(simDevices), { exact: true }).waitFor();
  await page.evaluate(() => { window.__sameDocument = true; });
  const second = await api("POST", "/api/v1/actions", { action: "locate", params: {}, search_type: "search", search_query: simPrefix });
  const row = page.locator(`tr[data-action="${second.id}"]`);
  await row.getByRole("link", { name: `#${second.id} locate` }).waitFor();
  await page.locator('[data-live="in_flight"]').getByText("1", { exact: true }).waitFor();
  // Its progress moves: devices run it, then finish it.
  await page.waitForFunction((id) =>
    Number(document.querySelector(`tr[data-action="${id}"] [data-cell="running"]`)?.textContent || 0) > 0, second.id);
  await shot(page, "overview");
  // Once every device finished, the action leaves the list; the failing
  // devices' errors are the last failures.
  await page.locator('[data-live="in_flight"]').getByText("0", { exact: true }).waitFor();
  await row.waitFor({ state: "detached" });
  await page.locator('[data-rows="failures"]').getByRole("link", { name: `#${second.id} locate` }).first().waitFor();
  assert.equal(await page.evaluate(() => window.__sameDocument), true, "the overview was not reloaded");

  step("upload a firmware bundle with a progress bar; deactivate a component");
  await page.goto(base + "/console/firmware");
  await page.getByLabel(/^Upload a bundle/).setInputFiles(env("BUNDLE_FILE"));
  // The progress bar's first showing is noted where it outlives the page.
  await page.evaluate(() => {
    const bar = document.querySelector("[data-upload-progress]");
    new MutationObserver(() => { if (!bar.hidden) sessionStorage.setItem("uploadProgress", String(bar.value)); })
      .observe(bar, { attributes: true });
  });
  await page.getByRole("button", { name: "Upload", exact: true }).click();
  await page.waitForURL(/\/console\/firmware\/[0-9a-f-]{36}$/);
  assert.ok(await page.evaluate(() => sessionStorage.getItem("uploadProgress")) !== null, "the progress bar showed");
  await page.getByRole("heading", { name: "Firmware 2.0.0" }).waitFor();
  await page.getByRole("button", { name: "Deactivate" }).click();
  await page.getByText("deactivated", { exact: true }).waitFor();
  await shot(page, "firmware");

  step("a reading opens an alert, and the alerts page shows it");
  await api("POST", `/api/v1/devices/${devices[1]}/streams/env`, [{ timestamp: Date.now(), sequence: 1, temp: 95 }]);
  for (let i = 0; (await api("GET", "/api/v1/alerts?state=active")).count === 0; i++) {
    if (i === 100) throw new Error("no alert opened within 10 s");
    await new Promise((r) => setTimeout(r, 100));
  }
  await page.goto(base + "/console/alerts?state=active");
  await page.getByRole("link", { name: devices[1] }).waitFor();
  await shot(page, "alerts");

  step("the device's page shows its latest reading and its alert");
  await page.getByRole("link", { name: devices[1] }).first().click();
  await page.getByRole("heading", { name: "Latest stream values" }).waitFor();
  await page.locator("table.streams").getByRole("cell", { name: "env", exact: true }).waitFor();
  await page.getByRole("cell", { name: "pump overheating" }).waitFor();
  await shot(page, "device");

  step("rotate the device's token: shown once; a reload neither rotates it again nor shows it");
  const [rotated] = await Promise.all([
    page.waitForResponse((r) => r.url().endsWith(`/console/devices/${devices[1]}/token`) && r.request().method() === "POST"),
    page.getByRole("button", { name: "Rotate token" }).click(),
  ]);
  assert.equal(rotated.headers()["cache-control"], "no-store", "the token's page is not cached");
  const token = await page.getByLabel("New device token (shown once)").inputValue();
  assert.match(token, /^fdt_/);
  // console.js replaces the history entry once the page has loaded, which
  // on a busy machine comes after the token's field is there to read.
  await page.waitForURL(base + `/console/devices/${devices[1]}`).catch(() => {});
  assert.equal(page.url(), base + `/console/devices/${devices[1]}`, "the history entry is the device page's");
  // The device authenticates with it (hawkBit DDI, TargetToken).
  const ddi = () => fetch(`${base}/${tenant}/controller/v1/${devices[1]}`, { headers: { authorization: `TargetToken ${token}` } });
  assert.equal((await ddi()).status, 200, "the new token works");
  await page.reload();
  await page.getByRole("heading", { name: `Device ${devices[1]}` }).waitFor();
  assert.equal(await page.getByLabel("New device token (shown once)").count(), 0);
  assert.ok(!(await page.content()).includes(token), "the token is not in the page");
  assert.equal((await ddi()).status, 200, "the reload did not rotate the token again");

  step("a form posted without the session's token is refused");
  const forged = await ctx.request.post(base + `/console/actions/${actionID}/abort`, { form: { csrf: "forged" }, maxRedirects: 0 });
  assert.equal(forged.status(), 403);

  step("at 1280x800 and at phone width (390x844) every page fits its width: wide tables scroll inside themselves");
  await fitsLayout(page, ["/console/", "/console/devices", `/console/devices/${devices[0]}`, "/console/actions",
    `/console/actions/${actionID}`, "/console/actions/new", "/console/firmware", "/console/alerts"]);
  await page.goto(base + "/console/");
  await shot(page, "overview-phone");
  await page.goto(base + `/console/devices/${devices[1]}`);
  await shot(page, "device-phone");
  await page.goto(base + `/console/actions/${actionID}`);
  await page.getByRole("heading", { name: /^Rollout/ }).waitFor();
  await shot(page, "action-phone");
  assert.deepEqual(cspViolations, [], "no Content-Security-Policy violation");

  step("a viewer sees no write controls, and the server refuses them anyway");
  const vctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const vpage = await vctx.newPage();
  await signIn(vpage, viewerKey);
  await vpage.goto(base + `/console/actions/${actionID}`);
  await vpage.getByRole("heading", { name: /^Rollout/ }).waitFor();
  assert.equal(await vpage.getByRole("button", { name: /Pause|Resume|Abort|Trigger/ }).count(), 0);
  await vpage.goto(base + `/console/devices/${devices[0]}`);
  assert.equal(await vpage.getByRole("button", { name: "Rotate token" }).count(), 0);
  await vpage.goto(base + "/console/actions");
  assert.equal(await vpage.getByRole("link", { name: "Dispatch an action" }).count(), 0);
  const res = await vpage.goto(base + "/console/actions/new");
  assert.equal(res.status(), 403);

  step("sign out ends the session");
  await page.setViewportSize({ width: 1280, height: 800 });
  await page.goto(base + "/console/");
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.waitForURL(/\/console\/signin/);
  await page.goto(base + "/console/devices");
  assert.match(page.url(), /\/console\/signin/);
  step("a person signs in through the tenant's OpenID provider");
  const octx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const opage = await octx.newPage();
  await opage.goto(base + "/console/signin");
  await opage.getByLabel("Tenant (single sign-on)").fill(tenant);
  await opage.getByRole("button", { name: "Sign in with your identity provider" }).click();
  await opage.getByLabel("Username:").fill(env("OIDC_USER"));
  await opage.getByLabel("Password:").fill(env("OIDC_PASSWORD"));
  await opage.getByRole("button", { name: "Login" }).click();
  await opage.waitForURL(base + "/console/");
  await opage.getByText(env("OIDC_EMAIL")).waitFor();
  await opage.getByText("viewer", { exact: true }).waitFor();
  console.log("console browser test: all steps passed");
} catch (e) {
  failed = true;
  console.error(e);
  if (page) {
    console.error(`at ${page.url()}:\n` + (await page.locator("main").innerText().catch(() => "")));
  }
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
