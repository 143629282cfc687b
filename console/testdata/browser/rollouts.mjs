// Drives the console's rollout builder and a rollout's page in Debian's
// Chromium, as an operator would. TestConsoleRolloutsInBrowser
// (cmd/fleetd/console_browser_test.go) starts fleetd with a bundle, an
// alert rule and devices, and runs this with:
//   FLEETD_URL, FLEETD_TENANT, OPERATOR_KEY, DEVICES (comma-separated ids),
//   VERSION (the bundle's), RULE (the alert rule's name), LAB (the two devices
//   whose metadata has ring=lab, the first of them connected, the other never),
//   SCREENSHOTS (optional).
// Every wait is on a condition in the page, bounded by Playwright's timeouts.
import assert from "node:assert/strict";
import { api, base, env, fitsLayout, run, shot, signIn, step, watchedPage } from "./harness.mjs";

const operatorKey = env("OPERATOR_KEY");
const devices = env("DEVICES").split(",");
const version = env("VERSION");
const rule = env("RULE");
const [labOnline, labOffline] = env("LAB").split(",");

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
  await page.getByLabel("phase 0 percentage, device ids, metadata or group").fill(devices[0]);
  await page.getByLabel("phase 1 name").fill("canary");
  await page.getByLabel("phase 1 percentage, device ids, metadata or group").fill("50");
  await page.getByLabel("phase 1 trigger").selectOption("manual");
  await page.getByLabel("phase 1 gate alert rules").selectOption({ label: rule });
  await page.getByLabel("phase 1 gate watch seconds").fill("60");
  await page.getByLabel("phase 2 name").fill("everyone");
  await page.getByLabel("phase 2 percentage, device ids, metadata or group").fill("100");
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
  await page.getByText(/no alert of 1 rule within 60 s/).waitFor();
  await page.waitForFunction(() => document.querySelector('[data-triggered="0"]')?.textContent === "released");
  await api(operatorKey, "POST", "/api/v1/devices/action/status", { device_id: devices[0], action_id: actionID, state: "Downloading", progress: 40 });
  await page.waitForFunction(() => document.querySelector('td[data-count="Progress"]:not([data-phase])')?.textContent === "1");

  step("abort asks first, naming how many device actions it cancels and how many are mid-download");
  await page.getByRole("button", { name: "Abort rollout" }).click();
  await page.locator("[data-rollout-status]").getByText("aborted").waitFor();
  assert.equal(dialogs.length, 1, "Abort asked for confirmation");
  assert.equal(dialogs[0], `Abort rollout #${actionID} (update_firmware)? No further phase is released, and this cancels the ${devices.length} device actions not finished: ` +
    `${devices.length - 1} not yet on their device are cancelled at once, and the 1 device that has it (mid-download, for an update) is sent a cancel_action and asked to stop. It cannot be undone.`);

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

  step("a metadata canary with a finished share, built in the builder");
  await page.goto(base + "/console/actions/new");
  await page.getByLabel("Action", { exact: true }).fill("reboot");
  await page.getByLabel("Select by").selectOption("all");
  await page.getByLabel("Release in phases").check();
  await page.getByLabel("phase 0 name").fill("lab");
  await page.getByLabel("phase 0 kind").selectOption("metadata");
  await page.getByLabel("phase 0 percentage, device ids, metadata or group").fill("ring=lab");
  await page.getByLabel("phase 1 name").fill("rest");
  await page.getByLabel("phase 1 percentage, device ids, metadata or group").fill("100");
  await page.getByLabel("phase 1 trigger").selectOption("after_previous");
  await page.getByLabel("phase 1 finished percent").fill("50");
  await page.getByRole("button", { name: "Count matching devices" }).click();
  await page.getByRole("status").getByText(`${devices.length} devices match this selection now.`).waitFor();
  // A metadata phase's devices are known when it triggers.
  assert.equal(await page.locator('[data-phase-count="0"]').textContent(), "—", "the metadata phase's count");
  assert.equal(await page.locator('[data-phase-count="1"]').textContent(), String(devices.length), "the rest's count");
  await page.getByRole("button", { name: "Dispatch", exact: true }).click();
  await page.waitForURL(/\/console\/actions\/\d+$/);
  const canaryID = Number(page.url().split("/").pop());
  await page.getByRole("cell", { name: "0 lab" }).waitFor();
  await page.getByRole("cell", { name: "metadata ring=lab" }).waitFor();

  step("while the next phase waits, the page says for which devices, and whether they are online");
  await page.waitForFunction(() => document.querySelector('[data-triggered="0"]')?.textContent === "released");
  const waiting = page.locator("[data-waiting-reason]");
  await waiting.getByText(/^phase 1 \(rest\) waits for 1 more device of earlier phases to finish/).waitFor();
  const reason = await waiting.textContent();
  assert.match(reason, new RegExp(`${labOnline} \\(\\w+, online`), "the waiting reason names the online device");
  assert.match(reason, new RegExp(`${labOffline} \\(Queued, offline`), "the waiting reason names the offline device");
  // The device table says which devices are online.
  await page.reload();
  const online = async (id) => (await page.getByRole("row").filter({ has: page.getByRole("link", { name: id, exact: true }) }).getByRole("cell").nth(1).textContent()).trim();
  assert.equal(await online(labOnline), "online", `${labOnline} in the device table`);
  assert.equal(await online(labOffline), "offline", `${labOffline} in the device table`);

  step("the offline device fails (its gateway reports it): half the lab is final, so the rest is released, live; the reason follows");
  await page.evaluate(() => { window.__sameDocument = true; });
  await api(operatorKey, "POST", "/api/v1/devices/action/status", { device_id: labOffline, action_id: canaryID, state: "Failed", progress: 10, errors: ["watchdog"] });
  await page.waitForFunction(() => document.querySelector('[data-triggered="1"]')?.textContent === "released");
  await waiting.getByText(/^every phase triggered; waiting for 5 devices to finish: /).waitFor();
  assert.equal(await page.evaluate(() => window.__sameDocument), true, "the page was not reloaded");

  step("once every device is final, the failed one is retried with a click");
  for (const d of devices.filter((d) => d !== labOffline)) {
    await api(operatorKey, "POST", "/api/v1/devices/action/status", { device_id: d, action_id: canaryID, state: "Completed", progress: 100 });
  }
  await page.locator("[data-rollout-status]").getByText("completed").waitFor();
  await page.reload();
  await page.getByRole("button", { name: "Retry the 1 failed device", exact: true }).click();
  await page.waitForURL((u) => /^\/console\/actions\/\d+$/.test(u.pathname) && u.pathname !== `/console/actions/${canaryID}`);
  const retryID = Number(page.url().split("/").pop());
  assert.notEqual(retryID, canaryID, "the retry is an action of its own");
  await page.getByRole("link", { name: `#${canaryID}`, exact: true }).waitFor(); // Retry of #canaryID
  const retried = (await api(operatorKey, "GET", `/api/v1/actions/${retryID}`));
  assert.equal(retried.retry_of, canaryID, "the retry's retry_of");
  assert.equal(retried.targeted, 1, "the retry targets the failed device");

  step("cancel asks first, naming what it cancels");
  await page.getByRole("button", { name: "Cancel the devices not finished" }).click();
  // The failed device is offline: its retry is cancelled at once.
  await page.waitForFunction(() => document.querySelector('td[data-count="Cancelled"]')?.textContent === "1");
  assert.equal(dialogs.length, 2, "Cancel asked for confirmation");
  assert.match(dialogs[1], new RegExp(`^Cancel action #${retryID} \\(reboot\\)\\? This cancels the 1 device action not finished: 1 not yet on its device is cancelled at once, `));

  step("the builder, the aborted rollout and the list fit 1280x800 and 390x844");
  await fitsLayout(page, [`/console/actions/new?action=update_firmware&version=${version}&rollout=1`, `/console/actions/${actionID}`, "/console/actions"]);
  assert.deepEqual(cspViolations, [], "no Content-Security-Policy violation");
});
