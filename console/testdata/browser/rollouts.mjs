// Drives the console's rollout builder and a rollout's page in Debian's
// Chromium, as an operator would. TestConsoleRolloutsInBrowser
// (cmd/fleetd/console_browser_test.go) starts fleetd with a bundle, an
// alert rule and devices, and runs this with:
//   FLEETD_URL, FLEETD_TENANT, OPERATOR_KEY, DEVICES (comma-separated ids),
//   VERSION (the bundle's), RULE (the alert rule's name), SCREENSHOTS (optional).
// Every wait is on a condition in the page, bounded by Playwright's timeouts.
import assert from "node:assert/strict";
import { api, base, env, fitsLayout, run, shot, signIn, step, watchedPage } from "./harness.mjs";

const operatorKey = env("OPERATOR_KEY");
const devices = env("DEVICES").split(",");
const version = env("VERSION");
const rule = env("RULE");

await run(async (browser, watch) => {
  const { page, dialogs, cspViolations } = await watchedPage(browser, "accept");
  watch(page);
  await signIn(page, operatorKey);

  step("a bundle's page rolls it out: the builder opens with a canary and everyone");
  await page.goto(base + "/console/firmware");
  await page.getByRole("link", { name: version }).first().click();
  await page.getByRole("link", { name: "Roll out this bundle" }).click();
  await page.waitForURL(/\/console\/actions\/new\?/);
  assert.equal(await page.getByLabel("Action", { exact: true }).inputValue(), "update_firmware");
  assert.ok(await page.getByLabel("Release in phases").isChecked(), "the rollout is on");
  assert.equal(await page.getByLabel("phase 0 name").inputValue(), "canary");
  assert.equal(await page.getByLabel("phase 1 name").inputValue(), "everyone");

  step("a third phase, a fixed list first, and gates of each kind");
  await page.getByRole("button", { name: "Add a phase" }).click();
  await page.getByLabel("phase 2 name").waitFor();
  await page.getByLabel("phase 0 name").fill("lab");
  await page.getByLabel("phase 0 kind").selectOption("fixed_list");
  await page.getByLabel("phase 0 percentage, device ids or metadata").fill(devices[0]);
  await page.getByLabel("phase 1 name").fill("canary");
  await page.getByLabel("phase 1 percentage, device ids or metadata").fill("50");
  await page.getByLabel("phase 1 trigger").selectOption("manual");
  await page.getByLabel("phase 1 gate alert rules").selectOption({ label: rule });
  await page.getByLabel("phase 1 gate watch seconds").fill("60");
  await page.getByLabel("phase 2 name").fill("everyone");
  await page.getByLabel("phase 2 percentage, device ids or metadata").fill("100");
  await page.getByLabel("phase 2 gate max failed percent").fill("25");
  await page.getByLabel("phase 2 gate min finished").fill("2");

  step("count: the selection, and each phase in its row");
  await page.getByRole("button", { name: "Count matching devices" }).click();
  await page.getByRole("status").getByText(`${devices.length} devices match this selection now.`).waitFor();
  // The listed device, then half of all less the one taken, then the rest.
  const want = [1, devices.length / 2 - 1, devices.length / 2];
  for (const [i, n] of want.entries()) {
    assert.equal(await page.locator(`[data-phase-count="${i}"]`).textContent(), String(n), `phase ${i}'s count`);
  }
  await page.locator("table.phase-form").scrollIntoViewIfNeeded();
  await shot(page, "dispatch-rollout");

  step("dispatch; the page numbers the phases as the API does");
  await page.getByRole("button", { name: "Dispatch", exact: true }).click();
  await page.waitForURL(/\/console\/actions\/\d+$/);
  const actionID = Number(page.url().split("/").pop());
  await page.getByRole("cell", { name: "0 lab" }).waitFor();
  await page.getByRole("cell", { name: "2 everyone" }).waitFor();
  await page.getByText(/no alert of 1 rules within 60 s/).waitFor();
  await page.waitForFunction(() => document.querySelector('[data-triggered="0"]')?.textContent === "released");
  await api(operatorKey, "POST", "/api/v1/devices/action/status", { device_id: devices[0], action_id: actionID, state: "Downloading", progress: 40 });
  await page.waitForFunction(() => document.querySelector('td[data-count="Progress"]:not([data-phase])')?.textContent === "1");

  step("abort asks first, naming how many device actions it cancels and how many are mid-download");
  await page.getByRole("button", { name: "Abort rollout" }).click();
  await page.locator("[data-rollout-status]").getByText("aborted").waitFor();
  assert.equal(dialogs.length, 1, "Abort asked for confirmation");
  assert.equal(dialogs[0], `Abort rollout #${actionID} (update_firmware)? No further phase is released, and this cancels the ${devices.length} device actions not finished: ` +
    `${devices.length - 1} not yet on their device are cancelled at once, and the 1 device that has it (mid-download, for an update) are sent a cancel_action and asked to stop. It cannot be undone.`);

  step("an aborted rollout does not look finished");
  await page.locator("[data-aborted-line]").waitFor({ state: "visible" });
  assert.equal(await page.locator("[data-finished-line]").isHidden(), true, "no \"100% finished\"");
  // The device mid-download is asked to stop; the others are cancelled.
  assert.match(await page.locator("[data-aborted-line]").textContent(), new RegExp(`aborted: 0 of ${devices.length} completed, ${devices.length - 1} cancelled`));
  assert.equal(await page.locator(".overall progress").getAttribute("class"), "stopped");
  await shot(page, "action-aborted");

  step("the actions list tells versions apart and keeps the abort's cancel_action on its action");
  await page.goto(base + "/console/actions");
  const row = page.getByRole("row").filter({ has: page.getByRole("link", { name: `#${actionID} update_firmware` }) });
  await row.getByText(`version=${version}`).waitFor();
  assert.equal(await page.getByRole("link", { name: / cancel_action$/ }).count(), 0, "no cancel_action listed");
  await page.getByRole("link", { name: "listed here" }).click();
  await page.getByRole("link", { name: / cancel_action$/ }).first().waitFor();

  step("the builder, the aborted rollout and the list fit 1280x800 and 390x844");
  await fitsLayout(page, [`/console/actions/new?action=update_firmware&version=${version}&rollout=1`, `/console/actions/${actionID}`, "/console/actions"]);
  assert.deepEqual(cspViolations, [], "no Content-Security-Policy violation");
});
