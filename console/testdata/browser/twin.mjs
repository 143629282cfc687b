// Drives the device twin's and the groups' pages in Debian's Chromium, as
// an operator and a viewer would. TestConsoleTwinInBrowser
// (console/twin_browser_test.go) starts fleetd with devices DEVICE (site
// berlin) and OTHER (site paris), and runs this with:
//   FLEETD_URL, FLEETD_TENANT, OPERATOR_KEY, VIEWER_KEY, ADMIN_KEY (sends
//   the device's reported state as uplink's device_shadow stream), DEVICE,
//   OTHER, SCREENSHOTS (optional).
// Every wait is on a condition in the page, bounded by Playwright's timeouts.
import assert from "node:assert/strict";
import { api, base, env, fitsLayout, run, shot, signIn, step, watchedPage } from "./harness.mjs";

const operatorKey = env("OPERATOR_KEY");
const viewerKey = env("VIEWER_KEY");
const adminKey = env("ADMIN_KEY");
const device = env("DEVICE");
const other = env("OTHER");

const pre = (page, which) => page.locator(`pre[data-twin="${which}"]`);
const json = async (page, which) => JSON.parse(await pre(page, which).textContent());

await run(async (browser, watch) => {
  const { page, dialogs, cspViolations } = await watchedPage(browser, "accept");
  watch(page);
  await signIn(page, operatorKey);

  step("a device without a shadow is in sync, at version 0");
  await page.goto(base + `/console/devices/${device}`);
  await page.getByText("In sync", { exact: true }).waitFor();
  assert.deepEqual(await json(page, "desired"), {});
  assert.match(await page.locator(".twin-state").textContent(), /Version 0;/);

  step("the operator sets a desired state; the page shows it and the delta");
  await page.getByLabel("Desired state (JSON)").fill('{"interval": 30, "log": {"level": "debug"}}');
  await page.getByRole("button", { name: "Save desired state" }).click();
  await page.waitForURL(new RegExp(`/console/devices/${device}#twin$`));
  await page.getByText("Out of sync", { exact: true }).waitFor();
  assert.deepEqual(await json(page, "desired"), { interval: 30, log: { level: "debug" } });
  assert.deepEqual(await json(page, "delta"), { interval: 30, log: { level: "debug" } });
  assert.match(await page.locator(".twin-state").textContent(), /Version 1;/);

  step("the device reports it (uplink's device_shadow stream): in sync after a reload");
  await api(adminKey, "POST", `/api/v1/devices/${device}/streams/device_shadow`,
    [{ timestamp: Date.now(), sequence: 1, interval: 30, log: { level: "debug" }, uptime: 12 }]);
  await page.reload();
  await page.getByText("In sync", { exact: true }).waitFor();
  assert.deepEqual(await json(page, "reported"), { interval: 30, log: { level: "debug" }, uptime: 12 });
  assert.deepEqual(await json(page, "delta"), {});
  await page.locator("#twin").scrollIntoViewIfNeeded();
  await shot(page, "device-twin");

  step("a page read before someone else's change saves nothing, says so and keeps the text");
  const second = await page.context().newPage();
  watch(second);
  await second.goto(base + `/console/devices/${device}`);
  await page.getByLabel("Desired state (JSON)").fill('{"interval": 60, "log": {"level": "debug"}}');
  await page.getByRole("button", { name: "Save desired state" }).click();
  await page.waitForURL(/#twin$/);
  await second.getByLabel("Desired state (JSON)").fill('{"interval": 5}');
  await second.getByRole("button", { name: "Save desired state" }).click();
  await second.getByRole("alert").getByText("Someone changed the desired state since this page was read").waitFor();
  assert.equal(await second.getByLabel("Desired state (JSON)").inputValue(), '{"interval": 5}', "the text typed is kept");
  assert.deepEqual(await json(second, "desired"), { interval: 60, log: { level: "debug" } }, "the state now is shown");
  const sh = await api(adminKey, "GET", `/api/v1/devices/${device}/shadow`);
  assert.equal(sh.desired.interval, 60, "the stale form did not overwrite the change");
  await second.close();

  step("text that is not a JSON object gets the API's message beside the form");
  await page.getByLabel("Desired state (JSON)").fill('{"interval": ');
  await page.getByRole("button", { name: "Save desired state" }).click();
  await page.locator('[data-twin="error"]').getByText("must be a JSON object", { exact: false }).waitFor();

  step("a group with a malformed selector is refused with the position");
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Groups" }).click();
  await page.waitForURL(base + "/console/groups");
  await page.getByLabel("Name").fill("berlin");
  await page.getByLabel("Selector").fill("site in (berlin");
  await page.getByRole("button", { name: "Create group" }).click();
  await page.locator("#selector-error").getByText("at position", { exact: false }).waitFor();
  assert.equal(await page.getByLabel("Selector").getAttribute("aria-invalid"), "true");
  assert.equal(await page.getByLabel("Name").inputValue(), "berlin", "the form is kept as typed");

  step("a good selector makes the group; its page lists its devices, the list counts them");
  await page.getByLabel("Selector").fill("site in (berlin), reported.log.level=debug");
  await page.getByRole("button", { name: "Create group" }).click();
  await page.waitForURL(base + "/console/groups/berlin");
  await page.locator('[data-group="count"]').getByText("1", { exact: true }).waitFor();
  await page.getByRole("link", { name: device, exact: true }).waitFor();
  assert.equal(await page.getByRole("link", { name: other, exact: true }).count(), 0);
  await shot(page, "group");
  await page.goto(base + "/console/groups");
  assert.equal(await page.locator('tr[data-group="berlin"] [data-cell="count"]').textContent(), "1");
  await shot(page, "groups");

  step("the devices page filters by group and twin state");
  await page.goto(base + "/console/devices");
  await page.getByLabel("Group").fill("berlin");
  await page.getByLabel("Twin").selectOption("out_of_sync");
  await page.getByRole("button", { name: "Filter" }).click();
  await page.waitForURL(/group=berlin/);
  await page.getByText("1 device", { exact: true }).waitFor(); // interval 60 is not reported yet
  await page.getByLabel("Twin").selectOption("in_sync");
  await page.getByRole("button", { name: "Filter" }).click();
  await page.getByText("0 devices").waitFor();

  step("the overview counts the devices in and out of sync");
  await page.goto(base + "/console/");
  assert.equal(await page.locator('[data-live="out_of_sync"]').textContent(), "1");
  assert.equal(await page.locator('[data-live="in_sync"]').textContent(), "1");

  step("the dispatch form targets the group and counts it");
  await page.goto(base + "/console/groups/berlin");
  await page.getByRole("link", { name: "Dispatch to this group" }).click();
  assert.equal(await page.getByLabel("Select by").inputValue(), "group");
  assert.equal(await page.locator("#group").inputValue(), "berlin");
  await page.getByLabel("Action", { exact: true }).fill("reboot");
  await page.getByRole("button", { name: "Count matching devices" }).click();
  assert.equal(await page.locator("[data-matches]").textContent(), "1");

  step("membership is live: the device reports another level and leaves the group");
  await api(adminKey, "POST", `/api/v1/devices/${device}/streams/device_shadow`,
    [{ timestamp: Date.now(), sequence: 2, log: { level: "info" } }]);
  await page.goto(base + "/console/groups/berlin");
  await page.getByText("No device is in this group now.").waitFor();

  step("the pages fit 1280x800 and 390x844");
  await fitsLayout(page, [`/console/devices/${device}`, "/console/groups", "/console/groups/berlin"]);
  await page.setViewportSize({ width: 1280, height: 800 });

  step("a viewer sees the twin and the groups without their forms");
  const viewer = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const vpage = await viewer.newPage();
  watch(vpage);
  await signIn(vpage, viewerKey);
  await vpage.goto(base + `/console/devices/${device}`);
  await vpage.locator('pre[data-twin="desired"]').waitFor();
  assert.equal(await vpage.getByLabel("Desired state (JSON)").count(), 0, "a viewer has no desired state form");
  await vpage.goto(base + "/console/groups/berlin");
  assert.equal(await vpage.getByRole("button", { name: "Delete group" }).count(), 0, "a viewer cannot delete a group");
  await vpage.goto(base + "/console/groups");
  assert.equal(await vpage.getByRole("button", { name: "Create group" }).count(), 0, "a viewer cannot create a group");
  await viewer.close();

  step("the operator deletes the group after confirming");
  await page.goto(base + "/console/groups/berlin");
  await page.getByRole("button", { name: "Delete group" }).click();
  await page.waitForURL(base + "/console/groups");
  await page.getByText("No group yet.").waitFor();
  assert.match(dialogs.at(-1) || "", /Delete group berlin\?/);
  assert.deepEqual(cspViolations, [], "no Content-Security-Policy violation");
});
