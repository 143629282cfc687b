// Drives the console's alerts pages in Debian's Chromium, as an operator
// and a viewer would. TestConsoleAlertsInBrowser
// (cmd/fleetd/console_browser_test.go) starts fleetd, provisions a device
// and the keys, and runs this with:
//   FLEETD_URL, FLEETD_TENANT, OPERATOR_KEY, VIEWER_KEY, DEVICE_KEY (a gateway's key),
//   DEVICE (a device whose metadata has site=harbour), WEBHOOK_URL (a receiver fleetd may reach),
//   SCREENSHOTS (a directory, optional).
// Every wait is on a condition in the page, bounded by Playwright's timeouts.
import assert from "node:assert/strict";
import { env, base, step, shot, call, api, signIn, run, fitsLayout, watchedPage } from "./harness.mjs";

const operatorKey = env("OPERATOR_KEY");
const viewerKey = env("VIEWER_KEY");
const deviceKey = env("DEVICE_KEY");
const device = env("DEVICE");
const webhook = env("WEBHOOK_URL");
const ruleName = "pump overheating <script>alert(1)</script>";

// reloadUntil reloads the page until locator is there: for what fleetd
// does in the background (deliveries), which the page does not follow live.
async function reloadUntil(page, locator, what) {
  for (let i = 0; (await locator.count()) === 0; i++) {
    if (i === 100) throw new Error(`${what}: not shown after 100 reloads`);
    await new Promise((r) => setTimeout(r, 100));
    await page.reload();
  }
}

await run(async (browser, track) => {
  const { ctx, page, dialogs, cspViolations } = await watchedPage(browser);
  track(page);

  await signIn(page, operatorKey);

  step("the editor refuses a bad condition with the API's message and keeps what was typed");
  const bad = '{"any": [{"field": "temp", "operator": ">", "value": 80}, {"field": "temp", "operator": "=~", "value": "hot"}]}';
  const refused = await call(operatorKey, "POST", "/api/v1/alert-rules", { name: "probe", stream: "env", condition: JSON.parse(bad) });
  assert.equal(refused.status, 400);
  const apiMessage = refused.body.fields["condition.any[1].operator"];
  assert.ok(apiMessage, "the API names the bad operator");
  await page.getByRole("navigation").getByRole("link", { name: "Alerts", exact: true }).click();
  await page.getByRole("link", { name: "New alert rule" }).click();
  await page.getByLabel("Name").fill(ruleName);
  await page.getByLabel("Stream").fill("env");
  await page.getByLabel("Condition (JSON)").fill(bad);
  await page.getByLabel(/^Only devices whose metadata matches/).fill('{"site": "harbour"}');
  await page.getByRole("button", { name: "Create rule" }).click();
  const problem = page.locator("#condition-error");
  await problem.getByText(apiMessage).waitFor();
  await problem.getByText("condition.any[1].operator").waitFor();
  assert.equal(await page.getByLabel("Condition (JSON)").inputValue(), bad, "the condition is kept as typed");
  assert.equal(await page.getByLabel("Name").inputValue(), ruleName, "the name is kept as typed");
  assert.equal(await page.getByLabel("Condition (JSON)").getAttribute("aria-invalid"), "true");
  await shot(page, "alert-rule-editor");

  step("the threshold builder fills the JSON field; the server checks it as the API does");
  const condition = page.getByLabel("Condition (JSON)");
  const builder = page.getByRole("group", { name: "Or build a threshold" });
  await builder.getByLabel("Field of the reading").fill("temp");
  // Keyboard order: the field, the operator, the value.
  await page.keyboard.press("Tab");
  assert.equal(await page.evaluate(() => document.activeElement.id), "builder-operator");
  await builder.getByLabel("Operator").selectOption(">");
  await builder.getByLabel("Value", { exact: true }).fill("hot");
  assert.deepEqual(JSON.parse(await condition.inputValue()), { field: "temp", operator: ">", value: "hot" });
  await builder.getByRole("status").getByText('The condition now reads {"field":"temp","operator":">","value":"hot"}.').waitFor();
  const notNumber = await call(operatorKey, "POST", "/api/v1/alert-rules",
    { name: "probe", stream: "env", condition: { field: "temp", operator: ">", value: "hot" } });
  assert.equal(notNumber.status, 400);
  await page.getByRole("button", { name: "Create rule" }).click();
  await page.locator("#condition-error").getByText(notNumber.body.fields["condition.value"]).waitFor();
  // The page that answered shows the typed condition in the builder, once its script has run.
  await builder.getByLabel("Value", { exact: true }).waitFor();
  assert.equal(await builder.getByLabel("Value", { exact: true }).inputValue(), "hot");
  assert.equal(await builder.getByLabel("Field of the reading").inputValue(), "temp");
  await builder.scrollIntoViewIfNeeded();
  await shot(page, "alert-rule-builder");

  step("a good condition makes the rule; its name renders as text");
  await builder.getByLabel("Value", { exact: true }).fill("80");
  assert.deepEqual(JSON.parse(await condition.inputValue()), { field: "temp", operator: ">", value: 80 });
  await page.getByRole("button", { name: "Create rule" }).click();
  await page.waitForURL(/\/console\/alerts\/rules\/[0-9a-f-]{36}$/);
  const ruleID = page.url().split("/").pop();
  await page.getByRole("heading", { name: `Alert rule ${ruleName}` }).waitFor();
  await page.getByText("This rule has raised no alert.").waitFor();

  step("a notification rule: refused as the API refuses it, then made; its secret never shown");
  await page.getByRole("link", { name: "Add notification rule" }).click();
  await page.getByLabel("Channel").selectOption("webhook");
  await page.getByLabel("URL (webhook, Slack)").fill(webhook);
  await page.getByLabel(/^Headers/).fill("X-Team: ops");
  await page.getByLabel("Signing secret (webhook)").fill("s3cret-value");
  await page.getByLabel("Time zone").fill("Europe/Nowhere");
  await page.getByLabel(/^Body/).fill("<script>alert(1)</script> {{.Alert.DeviceID}} {{.Value.temp}}");
  await page.getByRole("button", { name: "Create notification rule" }).click();
  const tzRefused = await call(operatorKey, "POST", `/api/v1/alert-rules/${ruleID}/alert-notification-rules`,
    { channel_parameters: { type: "webhook", url: webhook }, timezone: "Europe/Nowhere" });
  await page.locator('[id="timezone-error"]').getByText(tzRefused.body.fields.timezone).waitFor();
  assert.equal(await page.getByLabel("Signing secret (webhook)").inputValue(), "", "the secret is not sent back");
  assert.equal(await page.getByLabel(/^Headers/).inputValue(), "X-Team: ops", "what was typed is kept");
  await page.getByLabel("Signing secret (webhook)").fill("s3cret-value");
  await page.getByLabel("Time zone").fill("Europe/Berlin");
  await page.getByRole("button", { name: "Create notification rule" }).click();
  await page.waitForURL(/\/notifications\/[0-9a-f-]{36}$/);
  const notificationPage = page.url();
  await page.getByText("<script>alert(1)</script> {{.Alert.DeviceID}} {{.Value.temp}}").waitFor();
  assert.ok(!(await page.content()).includes("s3cret-value"), "the secret is never shown");
  await page.getByText("Nothing sent yet").waitFor();
  await page.goto(base + `/console/alerts/rules/${ruleID}`);

  step("the device's data opens an alert, and the console shows it");
  await api(deviceKey, "POST", `/api/v1/devices/${device}/streams/env`, [{ timestamp: Date.now(), sequence: 1, temp: 95 }]);
  await page.reload();
  await page.getByRole("link", { name: device }).waitFor();
  await page.getByText("active", { exact: true }).waitFor();
  await shot(page, "alert-rule");
  await page.goto(base + "/console/alerts?state=active");
  const row = page.getByRole("row").filter({ has: page.getByRole("link", { name: device }) });
  await row.getByRole("link", { name: ruleName }).waitFor();
  await row.getByText('"temp": 95').waitFor();
  await shot(page, "alerts");

  step("the alert's notification is delivered, and its attempt shows");
  await page.goto(notificationPage);
  const delivered = page.getByRole("row").filter({ hasText: "delivered" }).filter({ hasText: "HTTP 200" });
  await reloadUntil(page, delivered, "the delivered notification");
  await delivered.getByRole("link", { name: device }).waitFor();
  await shot(page, "alert-notification");

  step("edit the rule: the form shows it, and the edit holds");
  await page.goto(base + `/console/alerts/rules/${ruleID}`);
  await page.getByRole("link", { name: "Edit rule" }).click();
  assert.equal(await page.getByLabel("Stream").getAttribute("readonly"), "", "a rule keeps its stream");
  // The builder is shown once the page's script has filled it from the JSON.
  await page.getByLabel("Value", { exact: true }).waitFor();
  assert.equal(await page.getByLabel("Value", { exact: true }).inputValue(), "80", "the builder shows the saved threshold");
  // The JSON stays editable, and the builder follows it.
  await page.getByLabel("Condition (JSON)").fill('{"field": "temp", "operator": ">", "value": 99}');
  assert.equal(await page.getByLabel("Value", { exact: true }).inputValue(), "99");
  await page.getByLabel("Closes after, seconds").fill("-1");
  await page.getByRole("button", { name: "Save rule" }).click();
  const refusedThreshold = await call(operatorKey, "POST", "/api/v1/alert-rules", { name: "probe", stream: "env", condition: { no_data_seconds: 5 }, deactivation_threshold_seconds: -1 });
  await page.locator("#deactivation_threshold_seconds-error").getByText(refusedThreshold.body.fields.deactivation_threshold_seconds).waitFor();
  await page.getByLabel("Closes after, seconds").fill("0");
  await page.getByRole("button", { name: "Save rule" }).click();
  await page.waitForURL(base + `/console/alerts/rules/${ruleID}`);
  await page.locator("[data-condition]").getByText("99").waitFor();
  const saved = await api(operatorKey, "GET", `/api/v1/alert-rules/${ruleID}`);
  assert.equal(saved.condition.value, 99);
  assert.equal(saved.name, ruleName);

  step("the device's next point, cool by the new condition, ends the alert");
  await api(deviceKey, "POST", `/api/v1/devices/${device}/streams/env`, [{ timestamp: Date.now(), sequence: 2, temp: 96 }]);
  await page.goto(base + "/console/alerts?state=ended");
  await page.getByRole("row").filter({ has: page.getByRole("link", { name: device }) }).waitFor();

  step("at 1280x800 and at phone width (390x844) every alerts page fits its width");
  await fitsLayout(page, ["/console/alerts/rules", `/console/alerts/rules/${ruleID}`, `/console/alerts/rules/${ruleID}/edit`,
    "/console/alerts/rules/new", notificationPage.slice(base.length), `/console/alerts/rules/${ruleID}/notifications/new`]);
  await page.setViewportSize({ width: 1280, height: 800 });
  assert.deepEqual(dialogs, [], "no script from a rule's name ran");
  assert.deepEqual(cspViolations, [], "no Content-Security-Policy violation");

  step("a viewer sees no write controls, and the server refuses them anyway");
  const vctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const vpage = await vctx.newPage();
  track(vpage);
  await signIn(vpage, viewerKey);
  await vpage.goto(base + "/console/alerts/rules");
  await vpage.getByRole("link", { name: ruleName }).click();
  await vpage.getByRole("heading", { name: `Alert rule ${ruleName}` }).waitFor();
  assert.equal(await vpage.getByRole("link", { name: /Edit rule|New alert rule/ }).count(), 0);
  assert.equal(await vpage.getByRole("button", { name: /Delete/ }).count(), 0);
  assert.equal(await vpage.getByRole("link", { name: "Add notification rule" }).count(), 0);
  await vpage.goto(notificationPage);
  await vpage.getByRole("heading", { name: `Notification rule of ${ruleName}` }).waitFor();
  assert.equal(await vpage.getByRole("link", { name: "Edit notification rule" }).count(), 0);
  assert.equal(await vpage.getByRole("button", { name: /Delete/ }).count(), 0);
  assert.ok(!(await vpage.content()).includes(new URL(webhook).pathname), "a viewer sees no URL path");
  const token = await vpage.locator('input[name="csrf"]').first().inputValue();
  const del = await vctx.request.post(base + `/console/alerts/rules/${ruleID}/delete`, { form: { csrf: token }, maxRedirects: 0 });
  assert.equal(del.status(), 403);
  assert.equal((await vpage.goto(base + "/console/alerts/rules/new")).status(), 403);
  assert.equal((await api(operatorKey, "GET", `/api/v1/alert-rules/${ruleID}`)).id, ruleID, "the rule is still there");

  step("a form posted without the session's token is refused");
  const forged = await ctx.request.post(base + `/console/alerts/rules/${ruleID}/delete`, { form: { csrf: "forged" }, maxRedirects: 0 });
  assert.equal(forged.status(), 403);

  step("the operator's Delete asks first, naming what goes with the rule; dismissed, nothing is deleted");
  await page.goto(base + `/console/alerts/rules/${ruleID}`);
  const before = dialogs.length;
  await page.getByRole("button", { name: `Delete rule ${ruleName}` }).click();
  assert.equal(dialogs.length, before + 1, "Delete asked for confirmation");
  assert.ok(dialogs.at(-1).startsWith(`Delete rule ${ruleName}? Its 1 notification rule, its `), dialogs.at(-1));
  assert.match(dialogs.at(-1), /, its (1 alert|(0|[2-9]|\d\d+) alerts) and their pending notifications are deleted with it\. It cannot be undone\.$/);
  assert.equal((await api(operatorKey, "GET", `/api/v1/alert-rules/${ruleID}`)).id, ruleID, "the rule is still there");
  console.log("alerts browser test: all steps passed");
});
