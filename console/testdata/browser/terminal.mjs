// Drives the console's terminal in Debian's Chromium against a device run
// by a real fleetd-agent. TestConsoleTerminalInBrowser
// (cmd/fleetd/console_terminal_browser_test.go) starts both and runs this
// with: FLEETD_URL, FLEETD_TENANT, OPERATOR_KEY (its key is named
// OPERATOR_NAME), VIEWER_KEY, DEVICE, SCREENSHOTS (optional).
// Every wait is on a condition in the page, bounded by Playwright's timeouts.
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { base, env, run, shot, signIn, step, watchedPage } from "./harness.mjs";

const device = env("DEVICE");
const operatorName = env("OPERATOR_NAME");

// openTerminal opens a terminal from the device's page and waits until
// the shell answers a command typed into it.
async function openTerminal(page) {
  await page.goto(base + "/console/devices/" + device);
  await page.getByRole("button", { name: "Open terminal" }).click();
  await page.waitForURL(/\/console\/remote-sessions\/[^/]+\/terminal$/);
  await page.getByRole("status").filter({ hasText: "Connected." }).waitFor();
  await page.locator("#terminal").click();
  await page.keyboard.type("echo $((6*7))sum\n");
  await page.locator(".xterm-rows").filter({ hasText: "42sum" }).waitFor();
}

await run(async (browser, watch) => {
  const { page, dialogs, cspViolations } = await watchedPage(browser, "accept");
  watch(page);

  step("an operator opens a terminal from the device's page and runs a command on the device");
  await signIn(page, env("OPERATOR_KEY"));
  await openTerminal(page);
  await page.keyboard.type("tty\n");
  await page.locator(".xterm-rows").filter({ hasText: "/dev/pts/" }).waitFor();
  await shot(page, "terminal");
  const styled = await page.locator(".xterm-rows").evaluate((e) => getComputedStyle(e).fontFamily);
  assert.ok(styled.includes("monospace") || styled.includes("courier"), `xterm.js's styles apply under the policy (font ${styled})`);

  step("the shell's exit ends the session; the page says so");
  await page.keyboard.type("exit 3\n");
  await page.getByRole("status").filter({ hasText: "The shell exited with status 3." }).waitFor();

  step("the session is listed with who, kind and bytes each way; an open one can be ended from the list");
  await openTerminal(page);
  const list = await page.context().newPage();
  watch(list);
  list.on("dialog", (d) => { dialogs.push(d.message()); d.accept(); });
  await list.goto(base + "/console/devices/" + device + "/remote-sessions");
  const open = list.getByRole("row").filter({ hasText: "open" });
  await open.waitFor();
  await open.getByRole("button", { name: /^End the session of/ }).click();
  await list.waitForURL(base + "/console/devices/" + device + "/remote-sessions");
  await page.getByRole("status").filter({ hasText: "Session ended: ended by " + operatorName + "." }).waitFor();
  // fleetd closes the terminal's WebSocket, on which the page says the
  // session ended, once it has recorded the end (docs/agent.md, Caps):
  // the list has it then, with its recording.
  await list.reload();
  assert.equal(await list.getByRole("row").filter({ hasText: "ended by " + operatorName }).count(), 1, "the list shows who ended the session");
  assert.equal(await list.getByRole("row").filter({ hasText: "open" }).count(), 0, "no session is open once the page says it ended");
  const exited = list.getByRole("row").filter({ hasText: "exited" }).or(list.getByRole("row").filter({ hasText: "closed by the device" })).first();
  await exited.waitFor();
  assert.match(await exited.innerText(), /shell/, "the kind is listed");
  assert.match(await exited.innerText(), /[1-9]\d* bytes\s+[1-9]\d* bytes/, "bytes each way are listed");

  step("the tenant records shells: the ended session's recording link downloads its asciicast");
  const link = exited.getByRole("link", { name: /asciicast$/ });
  assert.equal(await link.count(), 1, "the ended session's recording is listed");
  const [download] = await Promise.all([list.waitForEvent("download"), link.click()]);
  const session = (await link.getAttribute("href")).match(/\/remote-sessions\/([^/]+)\/recording$/)[1];
  assert.equal(download.suggestedFilename(), session + ".cast", "the download is named after its session");
  const cast = (await readFile(await download.path(), "utf8")).split("\n");
  assert.equal(JSON.parse(cast[0]).version, 2, "an asciicast v2 header");
  assert.ok(cast.slice(1).some((l) => l.includes('"o"') && l.includes("42sum")), "the shell's output is recorded");
  await list.goto(base + "/console/remote-sessions");
  await list.getByRole("cell", { name: device }).first().waitFor(); // the tenant's list names devices
  await shot(list, "remote-sessions");

  step("signing out ends the terminals that console session opened");
  await openTerminal(page);
  await list.goto(base + "/console/devices/" + device);
  await list.getByRole("button", { name: "Sign out" }).click();
  await page.getByRole("status").filter({ hasText: "Session ended: the console session that opened it ended." }).waitFor();

  assert.deepEqual(cspViolations, [], "no Content-Security-Policy violation");
  assert.deepEqual(dialogs.filter((d) => !d.startsWith("End this")), [], "no other dialog");

  step("a viewer gets no terminal: no button, and the terminal's URLs are refused");
  const viewer = await watchedPage(browser);
  watch(viewer.page);
  await signIn(viewer.page, env("VIEWER_KEY"));
  await viewer.page.goto(base + "/console/devices/" + device);
  await viewer.page.getByRole("link", { name: "Remote sessions" }).waitFor();
  assert.equal(await viewer.page.getByRole("button", { name: "Open terminal" }).count(), 0, "no terminal button for a viewer");
  const res = await viewer.page.goto(base + "/console/remote-sessions/any/terminal");
  assert.equal(res.status(), 403, "a viewer's terminal page is refused");
  await viewer.page.goto(base + "/console/devices/" + device + "/remote-sessions");
  assert.equal(await viewer.page.getByRole("button", { name: /^End/ }).count(), 0, "a viewer may not end sessions");
});
