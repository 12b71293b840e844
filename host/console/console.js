// The sharehost console: one page over the admin API (GET /host, /pipelines, /faults,
// /pipelines/NAME/versions, /pipelines/NAME/dead-letters, /fleet; POST .../dead-letters/replay).
// No framework and no build step. Everything a plugin wrote (reasons, fault messages, record
// previews) is shown with textContent, never parsed as markup.
"use strict";

const POLL_MS = 2000;
// Records-per-second samples kept per pipeline: two minutes at one every POLL_MS.
const SAMPLES = 60;
const TOKEN_KEY = "sharehost-admin-token";

const state = {
  host: null,
  pipelines: [],
  faults: [],
  // The open pipeline's own faults (GET /faults?pipeline=NAME).
  pipelineFaults: [],
  // Per pipeline: [{t, judged}] newest last, for the records/s charts.
  samples: new Map(),
  route: { view: "host", pipeline: null },
  deadLetters: null,
  // GET /fleet, read while the fleet view is open.
  fleet: null,
};

// ---- small DOM helpers -------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, String(v));
    else if (k === "title") node.title = String(v);
    else if (k === "href") node.setAttribute("href", String(v));
    else node[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

const $ = (id) => document.getElementById(id);
const short = (hash) => (hash ? String(hash).slice(0, 12) : "-");
const fmt = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en"));
const when = (ms) => new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC";

function fill(tbody, rows, empty, columns) {
  tbody.replaceChildren(...rows);
  if (rows.length === 0) {
    tbody.append(el("tr", { class: "empty" }, el("td", { colSpan: columns }, empty)));
  }
}

// ---- the admin API -----------------------------------------------------------------------

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

async function getJson(path) {
  const r = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store" });
  if (!r.ok) {
    let why = await r.text();
    try {
      why = JSON.parse(why).error || why;
    } catch (_) {
      // plain text
    }
    throw new Error(`GET ${path}: ${r.status} ${why.trim()}`);
  }
  return r.json();
}

// An action: POST with the token when one is set. Returns {status, body}.
async function act(path, body) {
  const headers = { "Content-Type": "application/json", Accept: "application/json" };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  const r = await fetch(path, { method: "POST", headers, body: JSON.stringify(body) });
  const text = await r.text();
  let parsed = text;
  try {
    parsed = JSON.parse(text);
  } catch (_) {
    // plain text
  }
  return { status: r.status, body: parsed };
}

// ---- counters -----------------------------------------------------------------------------

function totals(p) {
  const t = { accepted: 0, rejected: 0, released: 0, faults: 0 };
  for (const c of Object.values(p.versions || {})) {
    t.accepted += c.accepted;
    t.rejected += c.rejected;
    t.released += c.released;
    t.faults += c.faults;
  }
  t.judged = t.accepted + t.rejected + t.released;
  return t;
}

function sample(p, now) {
  if (!p.versions) return;
  sampleJudged(p.name, totals(p).judged, now);
}

function sampleJudged(key, judged, now) {
  const s = state.samples.get(key) || [];
  s.push({ t: now, judged });
  while (s.length > SAMPLES + 1) s.shift();
  state.samples.set(key, s);
}

// The samples' key of a fleet host's pipeline (a pipeline name cannot hold a NUL).
const fleetKey = (host, pipeline) => `fleet\u0000${host}\u0000${pipeline}`;

// Records per second between consecutive samples (a counter that went back, after a
// restart of the pipeline's counters, counts from zero).
function rates(name) {
  const s = state.samples.get(name) || [];
  const out = [];
  for (let i = 1; i < s.length; i++) {
    const dt = (s[i].t - s[i - 1].t) / 1000;
    const dn = s[i].judged >= s[i - 1].judged ? s[i].judged - s[i - 1].judged : s[i].judged;
    out.push(dt > 0 ? dn / dt : 0);
  }
  return out;
}

// ---- charts and bars ----------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

// A line chart of `values` in a w×h box; the label says the latest value and the peak.
function chart(values, w, h, name) {
  const box = el("div", { class: "spark", "data-chart": name, "data-peak": values.length ? Math.max(...values) : 0 });
  const pic = svg("svg", { viewBox: `0 0 ${w} ${h}`, width: w, height: h, role: "img" });
  const peak = Math.max(1, ...values);
  const step = values.length > 1 ? w / (SAMPLES - 1) : 0;
  const x0 = w - step * (values.length - 1);
  const points = values.map((v, i) => `${(x0 + i * step).toFixed(1)},${(h - 2 - (v / peak) * (h - 4)).toFixed(1)}`);
  pic.append(svg("line", { x1: 0, y1: h - 1, x2: w, y2: h - 1, class: "axis" }));
  if (points.length > 1) {
    pic.append(svg("polyline", { points: points.join(" "), class: "line" }));
  }
  const last = values.length ? values[values.length - 1] : null;
  box.append(pic, el("span", { class: "spark-label" }, last === null ? "…" : `${last.toFixed(1)}/s`, values.length ? ` (peak ${Math.max(...values).toFixed(1)})` : ""));
  return box;
}

// A horizontal bar split into parts [{kind, n, label}], with the numbers written out.
function bar(parts, caption) {
  const total = parts.reduce((a, p) => a + p.n, 0);
  const strip = el("div", { class: "bar" });
  for (const p of parts) {
    if (p.n === 0) continue;
    strip.append(el("span", { class: `seg ${p.kind}`, "data-kind": p.kind, "data-count": p.n, title: `${p.label}: ${p.n}` }));
    strip.lastChild.style.flexGrow = String(p.n);
  }
  if (total === 0) strip.append(el("span", { class: "seg none" }));
  const legend = el("div", { class: "legend" }, ...parts.map((p) => el("span", { class: `key ${p.kind}` }, `${p.label} ${fmt(p.n)}`)));
  return el("div", { class: "tally", "data-tally": caption }, el("div", { class: "tally-caption" }, caption), strip, legend);
}

function verdictBar(tally, caption) {
  const accepted = Math.max(0, tally.records - tally.rejected - tally.released);
  return bar(
    [
      { kind: "accepted", n: accepted, label: "accepted" },
      { kind: "rejected", n: tally.rejected, label: "rejected" },
      { kind: "released", n: tally.released, label: "released" },
    ],
    `${caption}: ${fmt(tally.batches)} batches, ${fmt(tally.faulted_batches)} faulted`,
  );
}

// The rollout of a pipeline: a canary's tallies (candidate against the active version over
// the same batches) and its way to promotion, a shadow's agreement.
function rollout(p, compact) {
  const parts = [];
  const c = p.canary;
  if (c) {
    const head = el("div", { class: "rollout-head" }, el("span", { class: `badge canary-${c.state}` }, `canary ${c.state.replace("_", " ")}`), ` ${short(c.candidate)} at ${c.percent}%`);
    const box = el("div", { class: "rollout canary", "data-rollout": "canary", "data-state": c.state }, head);
    if (c.state === "running") {
      const goal = c.promote_after && c.promote_after.batches;
      if (goal) {
        const done = Math.min(c.candidate_tally.batches, goal);
        box.append(bar([{ kind: "progress", n: done, label: "batches judged" }, { kind: "remaining", n: goal - done, label: "to promotion" }], `promotion after ${fmt(goal)} batches`));
      }
    } else if (c.reason) {
      box.append(el("div", { class: "reason" }, c.reason));
    }
    if (!compact || c.state === "running") {
      box.append(verdictBar(c.candidate_tally, "candidate"), verdictBar(c.active_tally, "active"));
    }
    parts.push(box);
  }
  const s = p.shadow;
  if (s) {
    const agreed = Object.values(s.agreed || {}).reduce((a, n) => a + n, 0);
    const disagreed = Object.values(s.disagreed || {}).reduce((a, n) => a + n, 0);
    const box = el(
      "div",
      { class: "rollout shadow", "data-rollout": "shadow" },
      el("div", { class: "rollout-head" }, el("span", { class: "badge shadow" }, "shadow"), ` ${short(s.candidate)}, sample ${s.sample}`),
      bar(
        [
          { kind: "agreed", n: agreed, label: "agreed" },
          { kind: "disagreed", n: disagreed, label: "disagreed" },
        ],
        `${fmt(s.records)} records compared, ${fmt(s.faults)} faults`,
      ),
    );
    if (!compact && disagreed > 0) {
      box.append(el("div", { class: "legend" }, ...Object.entries(s.disagreed).map(([pair, n]) => el("span", { class: "key disagreed" }, `${pair} ${fmt(n)}`))));
    }
    parts.push(box);
  }
  if (parts.length === 0) return el("span", { class: "muted" }, "none");
  return el("div", { class: "rollouts" }, ...parts);
}

// ---- views -------------------------------------------------------------------------------

function renderHeader() {
  const h = state.host;
  if (!h) return;
  $("host-version").textContent = `version ${h.version}`;
  const ready = $("host-ready");
  ready.textContent = h.ready ? "ready" : "not ready";
  ready.className = `badge ${h.ready ? "ok" : "bad"}`;
  ready.title = h.not_ready.join("\n");
  const ts = $("token-state");
  if (!h.actions_need_token) ts.textContent = "actions are open: the host has no admin token";
  else ts.textContent = token() ? "token set for this tab" : "read-only: actions need the admin token";
}

function stateBadge(s) {
  const kind = { running: "ok", degraded: "warn", joining: "warn", starting: "warn", draining: "warn" }[s] || "bad";
  return el("span", { class: `badge ${kind}` }, s);
}

function renderPipelines() {
  const rows = state.pipelines.map((p) => {
    if (p.state === "failed" && !p.versions) {
      return el(
        "tr",
        { "data-pipeline": p.name, class: "failed" },
        el("td", {}, el("a", { href: `#/pipeline/${encodeURIComponent(p.name)}` }, p.name)),
        el("td", {}, stateBadge("failed")),
        el("td", { colSpan: 9, class: "error" }, `${p.error} (attempt ${p.attempts}, failing for ${p.failing_for_s} s)`),
      );
    }
    const t = totals(p);
    return el(
      "tr",
      { "data-pipeline": p.name },
      el("td", {}, el("a", { href: `#/pipeline/${encodeURIComponent(p.name)}` }, p.name)),
      el("td", { title: p.last_error || "" }, stateBadge(p.state)),
      el("td", { class: "mono", title: p.active_version }, short(p.active_version), p.signer ? el("div", { class: "muted" }, `signed ${p.signer}`) : null),
      el("td", {}, chart(rates(p.name), 140, 28, p.name)),
      el("td", { class: "num", "data-field": "accepted" }, fmt(t.accepted)),
      el("td", { class: "num", "data-field": "rejected" }, fmt(t.rejected)),
      el("td", { class: "num", "data-field": "released" }, fmt(t.released)),
      el("td", { class: "num", "data-field": "faults" }, fmt(t.faults)),
      el("td", { class: "num", "data-field": "dead_lettered" }, fmt(p.dead_lettered)),
      el("td", { class: "num" }, fmt(p.in_flight)),
      el("td", {}, rollout(p, true)),
    );
  });
  fill($("pipelines").tBodies[0], rows, "no pipelines loaded yet", 11);
}

function faultRows(faults) {
  return faults.map((f) =>
    el(
      "tr",
      { "data-fault": f.kind, "data-role": f.role },
      el("td", { class: "nowrap" }, when(f.at_ms)),
      el("td", {}, f.pipeline),
      el("td", {}, f.role, f.version ? el("span", { class: "mono muted" }, ` ${f.version}`) : null),
      el("td", {}, f.kind),
      el("td", { class: "num" }, f.records ? `${fmt(f.records)} (${f.first_offset}…${f.last_offset})` : "–"),
      el("td", { class: "message" }, f.message),
    ),
  );
}

function renderFaults() {
  fill($("host-faults").tBodies[0], faultRows(state.faults.slice(0, 10)), "no faults", 6);
  fill($("all-faults").tBodies[0], faultRows(state.faults), "no faults", 6);
  if (state.route.pipeline) {
    fill($("pipeline-faults").tBodies[0], faultRows(state.pipelineFaults), "no faults", 6);
  }
}

function renderPipeline() {
  const name = state.route.pipeline;
  $("pipeline-name").textContent = name;
  const p = state.pipelines.find((x) => x.name === name);
  const facts = $("pipeline-facts");
  if (!p) {
    facts.replaceChildren(el("dt", {}, "state"), el("dd", {}, "not loaded (yet)"));
    return;
  }
  const fact = (k, v) => [el("dt", {}, k), el("dd", {}, v === null || v === undefined || v === "" ? "–" : v)];
  if (!p.versions) {
    facts.replaceChildren(...fact("state", stateBadge(p.state)), ...fact("error", p.error));
    return;
  }
  facts.replaceChildren(
    ...fact("state", stateBadge(p.state)),
    ...fact("active version", el("span", { class: "mono", title: p.active_version }, short(p.active_version))),
    ...fact("component", p.component),
    ...fact("signer", p.signer),
    ...fact("in flight", `${fmt(p.in_flight)} (limit ${fmt(p.in_flight_limit)}, peak ${fmt(p.in_flight_peak)})`),
    ...fact("dead-lettered", fmt(p.dead_lettered)),
    ...fact("last error", p.last_error),
    ...fact("last swap error", p.last_swap_error),
  );
  $("pipeline-chart").replaceChildren(chart(rates(name), 460, 90, name));
  $("pipeline-rollout").replaceChildren(rollout(p, false));
}

async function loadVersions(name) {
  try {
    const v = await getJson(`/pipelines/${encodeURIComponent(name)}/versions`);
    const rows = v.versions.map((x) =>
      el(
        "tr",
        { "data-version": x.hash, class: x.active ? "active" : "" },
        el("td", { class: "mono", title: x.hash }, short(x.hash), x.active ? " (active)" : ""),
        el("td", {}, x.signer || "–"),
        el("td", { class: "nowrap" }, when(x.loaded_at_ms)),
        el("td", { class: "num" }, fmt(x.counters.accepted)),
        el("td", { class: "num" }, fmt(x.counters.rejected)),
        el("td", { class: "num" }, fmt(x.counters.released)),
        el("td", { class: "num" }, fmt(x.counters.faults)),
        el("td", { class: "path" }, x.path),
      ),
    );
    fill($("pipeline-versions").tBodies[0], rows, "no versions", 8);
  } catch (e) {
    fill($("pipeline-versions").tBodies[0], [], e.message, 8);
  }
}

async function loadDeadLetters(name) {
  const summary = $("dead-letters-summary");
  summary.textContent = "reading the dead-letter topic…";
  const tbody = $("dead-letters").tBodies[0];
  let v;
  try {
    v = await getJson(`/pipelines/${encodeURIComponent(name)}/dead-letters`);
  } catch (e) {
    summary.textContent = e.message;
    fill(tbody, [], "–", 7);
    return;
  }
  if (state.route.pipeline !== name) return;
  state.deadLetters = v;
  if (!v.topic) {
    summary.textContent = "This pipeline keeps no dead letters (no dead_letter_topic in the manifest).";
    fill(tbody, [], "–", 7);
    return;
  }
  summary.textContent =
    `${fmt(v.dead_letters)} dead letters in ${v.topic} (${fmt(v.read)} records read), ${v.groups.length} reasons` +
    (v.ungrouped ? `, ${fmt(v.ungrouped)} more of other reasons not grouped` : "") +
    (v.replay_state_error ? `. Replay counts unknown: ${v.replay_state_error}` : ".");
  const rows = v.groups.map((g) => {
    const button = el("button", { type: "button", class: "replay", "data-reason-regex": g.reason_regex, disabled: g.to_replay === 0 }, g.to_replay === 0 ? "Replayed" : "Replay");
    button.addEventListener("click", () => replay(name, g, button));
    return el(
      "tr",
      { "data-reason": g.shape, "data-count": g.count },
      el("td", { class: "reason", title: g.example }, g.shape, g.example !== g.shape ? el("div", { class: "muted" }, `e.g. ${g.example}`) : null),
      el("td", { class: "num", "data-field": "count" }, fmt(g.count)),
      el("td", { class: "num", "data-field": "replayed" }, fmt(g.replayed)),
      el("td", { class: "num", "data-field": "to_replay" }, fmt(g.to_replay)),
      el("td", { class: "mono" }, [...g.versions].join(" ")),
      el("td", { class: "message" }, g.example_value === null ? "null" : g.example_value),
      el("td", {}, button),
    );
  });
  fill(tbody, rows, "no dead letters", 7);
}

async function replay(name, group, button) {
  const out = $("replay-result");
  button.disabled = true;
  out.className = "";
  out.textContent = `replaying “${group.shape}”…`;
  const r = await act(`/pipelines/${encodeURIComponent(name)}/dead-letters/replay`, { reason: group.reason_regex });
  button.disabled = false;
  if (r.status === 401) {
    out.className = "error";
    out.dataset.outcome = "refused";
    out.textContent = "Refused: replaying needs the admin token (enter it above).";
    return;
  }
  if (r.status !== 200) {
    out.className = "error";
    out.dataset.outcome = "failed";
    out.textContent = `Replay failed (${r.status}): ${typeof r.body === "string" ? r.body : r.body.error}`;
    return;
  }
  const s = r.body.summary;
  out.className = "ok";
  out.dataset.outcome = "replayed";
  out.dataset.replayed = s.replayed;
  out.textContent = `Replayed ${fmt(s.replayed)} dead letters of “${group.shape}” to their topics` + (s.already_replayed ? ` (${fmt(s.already_replayed)} were replayed before)` : "") + (s.original_topic_missing ? `, ${fmt(s.original_topic_missing)} skipped: their topic is gone` : "") + ".";
  await loadDeadLetters(name);
}

// The fleet as this host reads it (GET /fleet): what the fleet wants of each pipeline, and
// every host heard from with what it runs. Read-only: fleet actions are signed by an
// operator's key, which the console never holds (`sharehost fleet ...`).
function canarySum(fleet, pipeline, seq) {
  const zero = () => ({ batches: 0, faulted_batches: 0, records: 0, rejected: 0, released: 0 });
  const sum = { candidate: zero(), active: zero(), hosts: 0 };
  for (const h of fleet.hosts) {
    for (const p of h.pipelines) {
      if (p.name !== pipeline || !p.canary || p.canary.seq !== seq) continue;
      sum.hosts += 1;
      for (const side of ["candidate", "active"]) {
        for (const k of Object.keys(sum[side])) sum[side][k] += p.canary[`${side}_tally`][k] || 0;
      }
    }
  }
  return sum;
}

function renderFleet() {
  const f = state.fleet;
  if (!f) return;
  $("fleet-name").textContent = f.fleet;
  $("fleet-answering").textContent = `as host ${f.host} reads it`;
  const refused = $("fleet-refused");
  refused.hidden = !f.last_refused;
  refused.textContent = f.last_refused ? `last refused record: ${f.last_refused}` : "";
  const version = (c) =>
    c ? el("span", { class: "mono", title: c.digest }, short(c.digest), el("span", { class: "muted" }, ` ${c.name}`)) : el("span", { class: "muted" }, "each host's manifest component");
  const wanted = Object.entries(f.pipelines).map(([name, d]) => {
    let canary = el("span", { class: "muted" }, "none");
    if (d.canary) {
      const sum = canarySum(f, name, d.canary.seq);
      const goal = d.canary.rules.promote_after && d.canary.rules.promote_after.batches;
      canary = el(
        "div",
        { class: "rollout canary", "data-rollout": "canary", "data-state": "running" },
        el("div", { class: "rollout-head" }, el("span", { class: "badge canary-running" }, "canary running"), ` ${short(d.canary.component.digest)} at ${d.canary.rules.percent}% on ${sum.hosts} host${sum.hosts === 1 ? "" : "s"}`),
        goal
          ? bar(
              [
                { kind: "progress", n: Math.min(sum.candidate.batches, goal), label: "batches judged" },
                { kind: "remaining", n: Math.max(goal - sum.candidate.batches, 0), label: "to promotion" },
              ],
              `the fleet's sum: promotion after ${fmt(goal)} batches`,
            )
          : null,
        verdictBar(sum.candidate, "candidate, every host"),
        verdictBar(sum.active, "active, every host"),
      );
    }
    const lc = d.last_canary;
    const last = lc
      ? el("div", { "data-last-canary": lc.promoted ? "promoted" : "rolled_back" }, el("span", { class: `badge canary-${lc.promoted ? "promoted" : "rolled_back"}` }, lc.promoted ? "promoted" : "rolled back"), ` ${short(lc.candidate)}`, el("div", { class: "reason" }, lc.reason))
      : el("span", { class: "muted" }, "–");
    const shadow = d.shadow ? el("span", {}, el("span", { class: "badge shadow" }, "shadow"), ` ${short(d.shadow[0].digest)}, sample ${d.shadow[1]}`) : el("span", { class: "muted" }, "none");
    return el(
      "tr",
      { "data-pipeline": name },
      el("td", {}, name),
      el("td", { class: "num" }, fmt(d.seq)),
      el("td", { "data-field": "active" }, version(d.active)),
      el("td", {}, canary),
      el("td", {}, shadow),
      el("td", {}, last),
      el("td", { class: "mono" }, d.history.map((h) => short(h.digest)).join(" ") || "–"),
    );
  });
  fill($("fleet-pipelines").tBodies[0], wanted, "the fleet has no actions yet", 7);
  const rows = [];
  for (const h of f.hosts) {
    const heard = () => el("td", { class: "nowrap", rowSpan: Math.max(h.pipelines.length, 1) }, `${fmt(Math.round(h.age_ms / 1000))} s ago `, h.stale ? el("span", { class: "badge bad" }, "stale") : null, h.conflict ? el("span", { class: "badge bad", title: h.conflict.reason }, "two writers") : null);
    const who = () => el("td", { rowSpan: Math.max(h.pipelines.length, 1) }, h.host, el("div", { class: "muted" }, `sharehost ${h.version}`));
    h.pipelines.forEach((p, i) => {
      const want = f.pipelines[p.name];
      const behind = want && want.active && want.active.digest !== p.active;
      rows.push(
        el(
          "tr",
          { "data-host": h.host, "data-pipeline": p.name, "data-stale": String(h.stale), class: h.stale ? "stale" : null },
          i === 0 ? who() : null,
          i === 0 ? heard() : null,
          el("td", {}, p.name),
          el("td", {}, stateBadge(p.state)),
          el("td", { class: "mono", title: p.active, "data-field": "active" }, short(p.active), behind ? el("span", { class: "badge warn" }, " not the fleet's") : null),
          el("td", { class: "num" }, fmt(p.applied_seq)),
          // The page's own samples of the host's published count, as on the host's view; the
          // host's figure over its last status interval as the title.
          el("td", { "data-field": "rate", title: `${fmt(Math.round(p.records_per_second))} records/s over the host's last status interval` }, chart(rates(fleetKey(h.host, p.name)), 120, 24, `${h.host} ${p.name}`)),
          el("td", { class: "num", "data-field": "judged" }, fmt(p.judged)),
          el("td", { class: "num" }, fmt(p.faults)),
          el("td", {}, p.canary ? `${fmt(p.canary.candidate_tally.batches)} candidate / ${fmt(p.canary.active_tally.batches)} active batches` : "–"),
          el("td", { class: "error" }, p.refused || ""),
        ),
      );
    });
    if (h.pipelines.length === 0) {
      rows.push(el("tr", { "data-host": h.host, "data-stale": String(h.stale) }, who(), heard(), el("td", { colSpan: 9, class: "muted" }, "no pipelines")));
    }
  }
  fill($("fleet-hosts").tBodies[0], rows, "no host heard from yet", 11);
}

// The registry of views: each shows its section and fills it.
const views = {
  host: { render: () => renderPipelines() },
  faults: { render: () => renderFaults() },
  pipeline: {
    render: () => renderPipeline(),
    enter: (name) => {
      loadVersions(name);
      loadDeadLetters(name);
    },
  },
  fleet: { render: () => renderFleet() },
};

function route() {
  const hash = decodeURIComponent(location.hash.replace(/^#\/?/, ""));
  const [view, ...rest] = hash.split("/");
  const next = view === "pipeline" && rest.length ? { view: "pipeline", pipeline: rest.join("/") } : { view: views[view] ? view : "host", pipeline: null };
  const changed = next.view !== state.route.view || next.pipeline !== state.route.pipeline;
  state.route = next;
  for (const section of document.querySelectorAll("main > section")) {
    section.hidden = section.dataset.view !== next.view;
  }
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("current", a.dataset.view === next.view);
  }
  if (changed && views[next.view].enter) views[next.view].enter(next.pipeline);
  render();
}

function render() {
  renderHeader();
  renderFaults();
  const v = views[state.route.view];
  if (v) v.render();
}

// ---- polling -----------------------------------------------------------------------------

async function poll() {
  const error = $("load-error");
  try {
    const open = state.route.pipeline;
    const [host, pipelines, faults, mine, fleet] = await Promise.all([
      getJson("/host"),
      getJson("/pipelines"),
      getJson("/faults"),
      open ? getJson(`/faults?pipeline=${encodeURIComponent(open)}`) : null,
      state.route.view === "fleet" ? getJson("/fleet") : null,
    ]);
    const now = Date.now();
    state.host = host;
    state.pipelines = pipelines;
    state.faults = faults.faults;
    state.pipelineFaults = mine && open === state.route.pipeline ? mine.faults : [];
    if (fleet) {
      state.fleet = fleet;
      // Each host's pipelines sampled like this host's, for their records/s charts.
      for (const h of fleet.hosts) {
        for (const p of h.pipelines) sampleJudged(fleetKey(h.host, p.name), p.judged, now);
      }
    }
    for (const p of pipelines) sample(p, now);
    error.hidden = true;
    render();
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
  } catch (e) {
    error.hidden = false;
    error.textContent = `The host does not answer: ${e.message}`;
  }
  setTimeout(poll, POLL_MS);
}

function start() {
  $("token").value = "";
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const t = $("token").value.trim();
    if (t) sessionStorage.setItem(TOKEN_KEY, t);
    $("token").value = "";
    renderHeader();
  });
  $("token-forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    renderHeader();
  });
  $("dead-letters-refresh").addEventListener("click", () => {
    if (state.route.pipeline) loadDeadLetters(state.route.pipeline);
  });
  window.addEventListener("hashchange", route);
  // The fleet tab appears once the host serves GET /fleet.
  fetch("/fleet", { method: "HEAD" }).then((r) => {
    $("nav-fleet").hidden = !(r.ok && views.fleet);
  }, () => {});
  route();
  poll();
}

start();
