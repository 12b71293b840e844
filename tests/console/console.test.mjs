// Drives the sharehost console in Debian's headless Chromium against a live host, which
// tests/console.rs starts and describes in the environment:
//
//   CONSOLE_URL           the admin listener, http://127.0.0.1:PORT
//   CONSOLE_TOKEN         the host's admin token
//   CONSOLE_EXPECT        what the page must show (JSON, see tests/console.rs); with "fleet",
//                         the fleet's page of a fleet host instead
//   CONSOLE_SCREENSHOTS   where to write one PNG per page
//   CONSOLE_NODE_MODULES  the folder where `npm ci` installed playwright-core
//   CHROMIUM              the browser (default /usr/bin/chromium)
//
// Every wait is for something to appear on the page, with a timeout only as a hang guard.
// Exits 1 naming the check that failed (and leaves a screenshot of the page as it was).
import { createRequire } from "node:module";
import { mkdirSync } from "node:fs";
import path from "node:path";
import assert from "node:assert/strict";

function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (tests/console.rs sets it)`);
  return v;
}

const base = env("CONSOLE_URL");
const token = env("CONSOLE_TOKEN");
const expect = JSON.parse(env("CONSOLE_EXPECT"));
const shots = env("CONSOLE_SCREENSHOTS");
const require = createRequire(path.join(env("CONSOLE_NODE_MODULES"), "package.json"));
const { chromium } = require("playwright-core");

// A hang guard, not a speed check: the host answers in milliseconds and polls every 2 s.
const PATIENCE = 120_000;

mkdirSync(shots, { recursive: true });
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  // The flags that work on this kind of machine (no sandbox as root; no background traffic to
  // a network that refuses it). playwright gives every launch a fresh profile directory.
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage({ viewport: { width: 1440, height: 900 } });

// Script errors and refusals by the content security policy fail the test; a failed request
// (the 401 of a refused replay, the 404 of /fleet) is expected and only logged by Chromium.
const problems = [];
page.on("pageerror", (e) => problems.push(`script error: ${e.message}`));
page.on("console", (m) => {
  if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) problems.push(`console error: ${m.text()}`);
});

let checks = 0;
async function check(what, f) {
  try {
    await f();
  } catch (e) {
    await page.screenshot({ path: path.join(shots, "failed.png"), fullPage: true }).catch(() => {});
    console.error(`FAILED: ${what}\n${e.stack || e}`);
    await browser.close();
    process.exit(1);
  }
  checks += 1;
  console.log(`ok: ${what}`);
}

const waitFor = (selector) => page.waitForSelector(selector, { timeout: PATIENCE });
const text = async (selector) => (await page.textContent(selector)).trim();
const number = async (selector) => Number((await text(selector)).replace(/[^0-9.-]/g, ""));
const attr = (selector, name) => page.getAttribute(selector, name);

async function done() {
  await check("no script error and nothing refused by the content security policy", async () => {
    assert.deepEqual(problems, []);
  });
  await browser.close();
  console.log(`${checks} passed, 0 failed`);
  process.exit(0);
}

// ---- the fleet's page (a fleet host; CONSOLE_EXPECT has "fleet") ------------------------------

if (expect.fleet) {
  const f = expect.fleet;
  await page.goto(`${base}/console`);
  await check("the fleet tab is shown on a fleet host", async () => {
    await waitFor('#nav-fleet:not([hidden])');
  });
  await page.click('nav a[data-view="fleet"]');
  await waitFor("#view-fleet:not([hidden])");
  await check("the fleet's pipeline shows its canary with the fleet's summed tallies", async () => {
    await waitFor(`#fleet-pipelines tr[data-pipeline="${f.pipeline}"] [data-rollout="canary"] [data-tally^="candidate"]`);
    assert.equal(await text("#fleet-name"), f.name);
  });
  await check("every host is listed, the killed one marked stale", async () => {
    for (const h of f.hosts) await waitFor(`#fleet-hosts tr[data-host="${h}"]`);
    await waitFor(`#fleet-hosts tr[data-host="${f.stale}"][data-stale="true"]`);
    await waitFor(`#fleet-hosts tr[data-host="${f.live}"][data-stale="false"]`);
  });
  await check("the live host's judged count grows while the page polls, and its records/s are charted", async () => {
    const sel = `#fleet-hosts tr[data-host="${f.live}"] [data-field="judged"]`;
    const first = await number(sel);
    await page.waitForFunction(([s, n]) => Number(document.querySelector(s)?.textContent.replace(/[^0-9]/g, "")) > n, [sel, first], { timeout: PATIENCE });
    await page.waitForSelector(`#fleet-hosts tr[data-host="${f.live}"] [data-field="rate"] polyline`, { state: "attached", timeout: PATIENCE });
  });
  await page.screenshot({ path: path.join(shots, "console-fleet.png"), fullPage: true });
  await done();
}

// ---- the host's page ------------------------------------------------------------------------

await page.goto(`${base}/console`);

await check("every pipeline is listed", async () => {
  for (const name of expect.pipelines) await waitFor(`#pipelines tr[data-pipeline="${name}"]`);
});

await check("the header says the host is read-only without the token", async () => {
  await page.waitForFunction(() => document.getElementById("token-state").textContent.includes("read-only"), null, { timeout: PATIENCE });
  assert.match(await text("#host-version"), /^version \d/);
});

const row = (name) => `#pipelines tr[data-pipeline="${name}"]`;
await check("counters and the active version are shown", async () => {
  const orders = row(expect.canary_pipeline);
  assert.ok((await number(`${orders} [data-field="rejected"]`)) >= expect.orders_rejected, "rejected");
  assert.ok((await number(`${orders} [data-field="accepted"]`)) > 0, "accepted");
  assert.equal(await number(`${orders} [data-field="dead_lettered"]`), expect.orders_rejected, "dead-lettered");
  assert.match(await text(`${orders} td.mono`), /^[0-9a-f]{12}/);
  assert.ok((await number(`${row(expect.faulty_pipeline)} [data-field="faults"]`)) > 0, "the faulty pipeline's faults");
});

await check("the canary's tallies are bars, candidate against active", async () => {
  const canary = `${row(expect.canary_pipeline)} [data-rollout="canary"][data-state="running"]`;
  await waitFor(canary);
  for (const side of ["candidate", "active"]) {
    const seg = `${canary} [data-tally^="${side}"] .seg.accepted`;
    await waitFor(seg);
    assert.ok(Number(await attr(seg, "data-count")) > 0, `${side} accepted`);
  }
  const faulted = await text(`${canary} [data-tally^="candidate"] .tally-caption`);
  assert.match(faulted, /[1-9][0-9,]* faulted/, "the candidate's faulted batches");
});

await check("the shadow's agreement is a bar", async () => {
  const shadow = `${row(expect.canary_pipeline)} [data-rollout="shadow"]`;
  await waitFor(`${shadow} .seg.agreed`);
  await waitFor(`${shadow} .seg.disagreed`);
  assert.ok(Number(await attr(`${shadow} .seg.disagreed`, "data-count")) > 0);
});

await check("records per second are drawn as a chart", async () => {
  for (const name of expect.pipelines) {
    const chart = `${row(name)} [data-chart="${name}"]`;
    await page.waitForSelector(`${chart} polyline`, { state: "attached", timeout: PATIENCE });
    await page.waitForFunction((sel) => Number(document.querySelector(sel)?.dataset.peak) > 0, chart, { timeout: PATIENCE });
  }
});

await check("recent faults are listed on the host's page", async () => {
  await waitFor(`#host-faults tr[data-role]`);
});

// Half a minute of samples, so the screenshot's charts show a line (the page polls every 2 s).
await page.waitForFunction(() => Number(document.body.dataset.polls) >= 15, null, { timeout: PATIENCE });
await page.screenshot({ path: path.join(shots, "console-host.png"), fullPage: true });

// ---- one pipeline: versions, rollout, dead letters grouped, replay ------------------------

await page.click(`${row(expect.canary_pipeline)} a`);
await waitFor("#view-pipeline:not([hidden])");

const group = (shape) => `#dead-letters tr[data-reason="${shape.replaceAll('"', '\\"')}"]`;
await check("dead letters are grouped by reason, with what a replay would do", async () => {
  for (const [shape, count] of Object.entries(expect.groups)) {
    await waitFor(group(shape));
    assert.equal(Number(await attr(group(shape), "data-count")), count, shape);
    assert.equal(await number(`${group(shape)} [data-field="to_replay"]`), count, `${shape}: to replay`);
    assert.equal(await number(`${group(shape)} [data-field="replayed"]`), 0, `${shape}: replayed`);
  }
  assert.equal(await page.locator("#dead-letters tr[data-reason]").count(), Object.keys(expect.groups).length);
});

await check("a record's value that looks like markup is shown as text", async () => {
  const cell = `${group(expect.replay_group)} td.message`;
  assert.equal(await page.textContent(cell), expect.hostile_value);
  assert.equal(await page.locator("#dead-letters img").count(), 0, "no element was made of it");
  assert.equal(await page.evaluate(() => document.body.dataset.pwned), undefined);
});

await check("the pipeline's versions and rollout are shown", async () => {
  await waitFor("#pipeline-versions tr.active");
  await waitFor('#pipeline-rollout [data-rollout="canary"] [data-tally^="candidate"]');
  await page.waitForSelector("#pipeline-chart polyline", { state: "attached", timeout: PATIENCE });
});

await check("the replay button is refused without the token", async () => {
  await page.click(`${group(expect.replay_group)} button.replay`);
  await waitFor('#replay-result[data-outcome="refused"]');
  await page.click("#dead-letters-refresh");
  await page.waitForFunction(() => !document.getElementById("dead-letters-summary").textContent.startsWith("reading"), null, { timeout: PATIENCE });
  assert.equal(await number(`${group(expect.replay_group)} [data-field="replayed"]`), 0, "nothing was replayed");
});

await check("with the token the replay button replays the group once", async () => {
  await page.fill("#token", token);
  await page.click('#token-form button[type="submit"]');
  await page.waitForFunction(() => document.getElementById("token-state").textContent.includes("token set"), null, { timeout: PATIENCE });
  await page.click(`${group(expect.replay_group)} button.replay`);
  await waitFor('#replay-result[data-outcome="replayed"]');
  assert.equal(Number(await attr("#replay-result", "data-replayed")), expect.groups[expect.replay_group]);
  // The group read again: those are remembered as replayed (their records, judged again and
  // rejected again, may already be new dead letters of the same reason, not replayed yet).
  await page.waitForFunction(
    ([sel, n]) => Number(document.querySelector(sel)?.textContent.replace(/[^0-9]/g, "")) === n,
    [`${group(expect.replay_group)} [data-field="replayed"]`, expect.groups[expect.replay_group]],
    { timeout: PATIENCE },
  );
});

await page.screenshot({ path: path.join(shots, "console-pipeline.png"), fullPage: true });

// ---- recent faults ------------------------------------------------------------------------

await page.click('nav a[data-view="faults"]');
await waitFor("#view-faults:not([hidden])");
await check("recent faults name who met them: a canary and an active version", async () => {
  for (const role of expect.fault_roles) await waitFor(`#all-faults tr[data-role="${role}"]`);
  await waitFor(`#all-faults tr[data-role="canary"] td.message`);
});
// The first screen of it: the page lists up to 200 faults.
await page.screenshot({ path: path.join(shots, "console-faults.png") });

await done();
