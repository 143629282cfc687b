// Drives the console's settings pages in Debian's Chromium, as a tenant's
// admin and a viewer would. TestConsoleSettingsInBrowser
// (cmd/fleetd/console_settings_browser_test.go) starts fleetd, configures
// the tenant's sign-in (S9) and runs this with:
//   FLEETD_URL, FLEETD_TENANT, ADMIN_KEY, VIEWER_KEY, OIDC_CLIENT_SECRET (the
//   secret S9 holds, which no page may show), SCREENSHOTS (optional).
// Every wait is on a condition in the page, bounded by Playwright's timeouts.
import assert from "node:assert/strict";
import { base, env, fitsLayout, run, shot, signIn, step, tenant, watchedPage } from "./harness.mjs";

const adminKey = env("ADMIN_KEY");
const viewerKey = env("VIEWER_KEY");
const clientSecret = env("OIDC_CLIENT_SECRET");
const markup = "<script>alert(1)</script>@example.com";

async function api(key, method, p, body) {
  return fetch(base + p, {
    method,
    headers: { "x-service-tenant": tenant, "x-service-api-key": key, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
}

await run(async (browser, watch) => {
  const { page, dialogs, cspViolations } = await watchedPage(browser, "accept");
  watch(page);

  step("an admin finds the settings in the navigation");
  await signIn(page, adminKey);
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Settings" }).click();
  await page.getByRole("heading", { name: "API keys", exact: true }).waitFor();

  step("create a key: it is shown once, on the page answering the form");
  await page.getByLabel("Name", { exact: true }).fill("ci-runner");
  await page.getByLabel("Role", { exact: true }).selectOption("operator");
  await page.getByLabel("Holder's email (optional)").fill(markup);
  const [answer] = await Promise.all([
    page.waitForResponse((r) => r.url() === base + "/console/settings/keys" && r.request().method() === "POST"),
    page.getByRole("button", { name: "Create key" }).click(),
  ]);
  assert.equal(answer.headers()["cache-control"], "no-store", "the key's page is not cached");
  const key = await page.getByLabel(/^The new key of ci-runner/).inputValue();
  assert.match(key, /^fk_/);
  assert.ok(!answer.request().url().includes(key) && !page.url().includes(key), "the key is in no URL");
  assert.equal(page.url(), base + "/console/settings/keys", "the history entry is the list's");
  await page.getByRole("cell", { name: markup }).waitFor(); // the holder's email, as text
  assert.deepEqual(dialogs, [], "no script from the email ran");
  await shot(page, "settings-keys");
  assert.equal((await api(key, "GET", "/api/v1/devices")).status, 200, "the new key works");

  step("a reload shows the list, without the key");
  // console.js makes the history entry the list's on DOMContentLoaded; the
  // URL is the same either way, and a reload before it would send the form
  // again. The document is complete only after that handler ran.
  await page.waitForFunction(() => document.readyState === "complete");
  await page.reload();
  await page.getByRole("heading", { name: "API keys", exact: true }).waitFor();
  await page.getByRole("button", { name: "Delete API key ci-runner" }).waitFor();
  assert.equal(await page.getByLabel(/^The new key of/).count(), 0);
  assert.ok(!(await page.content()).includes(key), "the key is not in the page");

  step("the key's holder signs in and makes a change");
  const hctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const held = await hctx.newPage();
  watch(held);
  await signIn(held, key);
  await held.getByRole("banner").getByText(markup).waitFor(); // who signed in: the key's holder
  assert.equal((await api(key, "POST", "/api/v1/devices", { id: "made-by-ci" })).status, 201);

  step("delete the key: the console asks first");
  await page.getByRole("button", { name: "Delete API key ci-runner" }).click();
  await page.getByRole("button", { name: "Delete API key ci-runner" }).waitFor({ state: "detached" });
  assert.equal(dialogs.length, 1, "Delete asked for confirmation");
  assert.match(dialogs[0], /Delete ci-runner\?/);

  step("the deleted key's session is signed out on its next request");
  await held.goto(base + "/console/devices");
  assert.match(held.url(), /\/console\/signin/);
  assert.equal((await api(key, "GET", "/api/v1/devices")).status, 401);

  step("the audit log shows both, and its filters find them");
  await page.getByRole("navigation", { name: "Settings" }).getByRole("link", { name: "Audit log" }).click();
  await page.getByRole("heading", { name: "Audit log", exact: true }).waitFor();
  const rowOf = (action, target) => page.getByRole("row").filter({ hasText: action }).filter({ hasText: target });
  await rowOf("apikey.create", "apikeys/ci-runner").waitFor();
  await rowOf("apikey.delete", "apikeys/ci-runner").waitFor();
  await rowOf("device.create", "devices/made-by-ci").waitFor();
  await shot(page, "settings-audit");
  await page.getByLabel("Actor").fill("ci-runner");
  await page.getByRole("button", { name: "Filter" }).click();
  // The key's holder made a device and signed in (its session's start).
  await page.getByText("2 entries").waitFor();
  await rowOf("device.create", "devices/made-by-ci").waitFor();
  await rowOf("console.session.start", "console-sessions/").waitFor();
  assert.equal(await rowOf("apikey.create", "apikeys/ci-runner").count(), 0, "the admin's changes are filtered out");
  await page.getByLabel("Actor").fill("");
  await page.getByLabel("Action").fill("apikey");
  await page.getByRole("button", { name: "Filter" }).click();
  await page.waitForURL(/action=apikey/);
  await rowOf("apikey.create", "apikeys/ci-runner").waitFor();
  await rowOf("apikey.delete", "apikeys/ci-runner").waitFor();
  assert.equal(await rowOf("device.create", "devices/made-by-ci").count(), 0, "other kinds are filtered out");
  // An actor's name filters by that actor too.
  await page.getByRole("link", { name: "Clear" }).click();
  await page.waitForURL(base + "/console/settings/audit");
  await page.getByRole("row").filter({ hasText: "apikey.delete" }).getByRole("link", { name: "admin" }).first().click();
  await page.waitForURL(/actor=admin/);
  await rowOf("apikey.delete", "apikeys/ci-runner").waitFor();
  assert.equal(await rowOf("device.create", "devices/made-by-ci").count(), 0);
  // A range that ends before anything happened has nothing.
  await page.getByLabel("Before (UTC)").fill("2020-01-01T00:00:00");
  await page.getByRole("button", { name: "Filter" }).click();
  await page.getByText("No entry matches these filters.").waitFor();

  step("the tenant's sign-in settings: shown, saved, the secret never shown");
  await page.getByRole("navigation", { name: "Settings" }).getByRole("link", { name: "Sign-in" }).click();
  await page.getByRole("heading", { name: "Sign-in", exact: true }).waitFor();
  assert.equal(await page.getByLabel("Client id").inputValue(), "fleetd-console");
  await page.getByText("A secret is set").waitFor();
  assert.equal(await page.getByLabel("Client secret", { exact: true }).inputValue(), "");
  assert.ok(!(await page.content()).includes(clientSecret), "the client secret is not in the page");
  await page.getByLabel("Default role").selectOption("operator");
  await page.getByLabel("Client id").scrollIntoViewIfNeeded();
  await shot(page, "settings-signin");
  await page.getByRole("button", { name: "Save sign-in settings" }).click();
  await page.getByRole("status").getByText("Saved.").waitFor();
  assert.equal(await page.getByLabel("Default role").inputValue(), "operator");
  await page.getByText("A secret is set").waitFor(); // kept, as it was left blank

  step("at 1280x800 and at phone width (390x844) every settings page fits its width");
  await fitsLayout(page, ["/console/settings/keys", "/console/settings/auth", "/console/settings/sessions", "/console/settings/audit",
    "/console/settings/audit?action=apikey&actor=admin"]);
  await page.goto(base + "/console/settings/audit");
  await shot(page, "settings-audit-phone");
  await page.setViewportSize({ width: 1280, height: 800 });
  assert.deepEqual(cspViolations, [], "no Content-Security-Policy violation");

  step("a viewer has no settings, and the server refuses their forms anyway");
  const vctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const vpage = await vctx.newPage();
  watch(vpage);
  await signIn(vpage, viewerKey);
  assert.equal(await vpage.getByRole("link", { name: "Settings" }).count(), 0, "no link to the settings");
  for (const p of ["/console/settings/keys", "/console/settings/auth", "/console/settings/audit"]) {
    const res = await vpage.goto(base + p);
    assert.equal(res.status(), 403, p);
    assert.equal(await vpage.getByRole("button", { name: /Create key|Delete|Save/ }).count(), 0);
  }
  // The session's own token, from its sign-out form: only the role stops it.
  const csrf = await vpage.locator('input[name="csrf"]').first().getAttribute("value");
  for (const [p, form] of [
    ["/console/settings/keys", { csrf, name: "sneaky", role: "admin" }],
    ["/console/settings/keys/admin/delete", { csrf }],
    ["/console/settings/auth", { csrf, method: "webhook", webhook_url: "https://evil.example/", default_role: "admin" }],
  ]) {
    const res = await vctx.request.post(base + p, { form, maxRedirects: 0 });
    assert.equal(res.status(), 403, p);
  }
  const keys = await (await api(adminKey, "GET", "/api/v1/apikeys")).json();
  assert.ok(!keys.apikeys.some((k) => k.name === "sneaky"), "no key was made");

  step("Settings → Sessions lists the open sessions; ending the viewer's, after confirming, signs that browser out");
  await page.goto(base + "/console/settings/sessions");
  await page.getByText("this session").waitFor();
  const endViewer = page.getByRole("button", { name: "End this session of victor", exact: true });
  const asked = dialogs.length;
  await endViewer.click();
  await endViewer.waitFor({ state: "detached" });
  assert.equal(dialogs.length, asked + 1, "End asked for confirmation");
  assert.equal(dialogs.at(-1), "End this session of victor?");
  await vpage.goto(base + "/console/devices");
  assert.match(vpage.url(), /\/console\/signin/, "the viewer's browser is signed out");
  await page.goto(base + "/console/devices");
  assert.equal(page.url(), base + "/console/devices", "the admin is still signed in");
});
