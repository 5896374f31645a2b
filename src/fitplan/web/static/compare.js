// fitplan serve's page, the comparison: a pinned scenario beside the current one, two columns and the
// difference (current − pinned) for the verdict, the peak, the device total, the usable memory, time, cost and
// each component at the peak. The pinned scenario is the address's `pin` parameter (the API query of that
// scenario, never sent to the API), so a link reproduces the comparison; its figures are /api/view's (the view
// on screen when it was pinned, or asked once when a link opens). A difference is a subtraction of two of the
// API's numbers; nothing else is computed here. Also the print button (the print view is app.css's).
"use strict";

const PIN = "pin";
let pinned = null;       // the pinned scenario's API query, or null
let pinnedView = null;   // its /api/view
let pinnedError = null;

// The page's address for the scenario query `qs`: the query, then the pinned scenario's.
function addressOf(qs) {
  const q = new URLSearchParams(qs);
  if (pinned !== null) q.append(PIN, pinned);
  const s = q.toString();
  return s ? "?" + s : location.pathname;
}

// The address's parameters less `pin`, which becomes the pinned scenario.
function takePin(params) {
  pinned = params.has(PIN) ? params.get(PIN) : null;
  params.delete(PIN);
  return params;
}

async function loadPinned() {
  if (pinned === null) return;
  try {
    pinnedView = await getJSON("/api/view?" + pinned);
    pinnedError = null;
  } catch (e) {
    pinnedError = e.message;
  }
  if (lastView) renderCompare(lastView);
}

function pin() {
  if (!lastView || document.body.dataset.state !== "ready") return;
  pinned = lastQuery;
  pinnedView = lastView;  // the view on screen is the pinned scenario's
  pinnedError = null;
  history.replaceState(null, "", addressOf(lastQuery));
  renderCompare(lastView);
  $("compare-card").scrollIntoView({block: "nearest"});
}

function unpin() {
  pinned = pinnedView = pinnedError = null;
  history.replaceState(null, "", addressOf(lastQuery || ""));
  renderCompare(null);
  $("pin").focus();
}

// Back to the pinned scenario: its flags in the form (it stays pinned).
function restorePinned() {
  if (pinned === null) return;
  writeForm(new URLSearchParams(pinned));
  changed();
}

// The cost the answer line shows: the chosen provider's, else the cheapest listed ({value, currency, provider}).
function shownCost(d) {
  const est = d.estimate;
  const chosen = est.cost && est.cost.provider ? d.providers.find((p) => p.id === est.cost.provider) : null;
  const p = chosen && chosen.cost ? chosen : cheapest(d.providers);
  return p ? {value: p.cost.on_demand_usd, currency: p.cost.currency, provider: p.id} : null;
}

// [label, pinned, current, format, explain]: the figures compared, the breakdown's rows in its order.
function compareRows(a, b) {
  const ma = a.estimate.memory, mb = b.estimate.memory;
  const ca = shownCost(a), cb = shownCost(b);
  const rows = [
    ["peak", ma.per_gpu_bytes.peak, mb.per_gpu_bytes.peak, "bytes", "peak"],
    ["device total", ma.per_gpu_bytes.device_total, mb.per_gpu_bytes.device_total, "bytes", "device_total"],
    ["usable", ma.usable_bytes, mb.usable_bytes, "bytes", "usable"],
    ["time", a.estimate.time ? a.estimate.time.seconds : null, b.estimate.time ? b.estimate.time.seconds : null, "seconds", "seconds"],
    ["cost (on demand)", ca ? ca.value : null, cb ? cb.value : null, "money", "cost",
      [ca, cb].map((c) => c ? c.provider : "")],
  ];
  const keys = [...b.rows, ...a.rows.filter((r) => !b.rows.some((s) => s.key === r.key))].filter((r) => !r.overhead);
  const pa = ma.peak_breakdown_bytes || {}, pb = mb.peak_breakdown_bytes || {};
  for (const r of keys) {
    if ((pa[r.key] || 0) === 0 && (pb[r.key] || 0) === 0) continue;
    rows.push([r.label + " (at the peak)", pa[r.key] ?? 0, pb[r.key] ?? 0, "bytes", "row:" + r.key]);
  }
  return rows;
}

function shown(v, kind) {
  if (v === null || v === undefined) return "–";
  return kind === "bytes" ? gb(v) : kind === "seconds" ? hours(v) : money(v);
}

// A small difference of bytes in MB or kB (MiB or KiB), where GB would read "0.00".
function smallBytes(v) {
  const k = unit === "GiB" ? 1024 : 1000, [mb, kb] = unit === "GiB" ? [" MiB", " KiB"] : [" MB", " kB"];
  if (v >= UNITS[unit] / 100) return gb(v);
  return v >= k * k ? (v / (k * k)).toFixed(2) + mb : (v / k).toFixed(1) + kb;
}

function signed(delta, kind) {
  if (delta === null) return "–";
  if (delta === 0) return "same";
  return (delta > 0 ? "+" : "−") + (kind === "bytes" ? smallBytes(Math.abs(delta)) : shown(Math.abs(delta), kind));
}

// The flags that differ: "micro-batch 4 → 8".
function differences(a, b) {
  const pa = new URLSearchParams(a), pb = new URLSearchParams(b);
  const names = [...new Set([...pa.keys(), ...pb.keys()])];
  return names.filter((n) => pa.get(n) !== pb.get(n)).map((n) =>
    `${LABELS[n] || n} ${pa.has(n) ? pa.get(n) : "default"} → ${pb.has(n) ? pb.get(n) : "default"}`);
}

// "fits" / "does not fit", with the GPU's name when the two scenarios' GPUs differ.
function verdictCell(d, other) {
  const fits = d.estimate.memory.fits, gpu = d.estimate.gpu, og = other.estimate.gpu;
  const name = gpu && (!og || og.id !== gpu.id) ? " " + gpu.name : "";
  return el("td", {"data-fits": fits === null || fits === undefined ? "" : String(fits),
    text: !gpu ? "no GPU" : (fits ? "fits" : "does not fit") + name});
}

function renderCompare(current) {
  const card = $("compare-card"), box = $("compare");
  $("pin").textContent = pinned === null ? "Pin to compare" : "Pin this";
  $("pin").title = pinned === null ? "Keep this scenario beside the next ones: two columns and their differences"
    : "Pin this scenario instead of the pinned one";
  card.hidden = pinned === null;
  if (pinned === null || !current) { box.replaceChildren(); return; }
  if (pinnedError) { box.replaceChildren(el("p", {class: "error", text: "the pinned scenario: " + pinnedError})); return; }
  if (!pinnedView) { box.replaceChildren(el("p", {class: "note", text: "estimating the pinned scenario…"})); return; }
  const a = pinnedView, b = current;
  const diff = differences(pinned, lastQuery || "");
  const t = el("table", {class: "compare", id: "compare-table"},
    el("tr", {}, el("th", {text: ""}), el("th", {text: "pinned"}), el("th", {text: "current"}), el("th", {text: "current − pinned"})));
  const fa = a.estimate.memory.fits, fb = b.estimate.memory.fits;
  t.append(el("tr", {"data-row": "fits"}, el("th", {scope: "row", text: "verdict"}), verdictCell(a, b), verdictCell(b, a),
    el("td", {class: fa === fb ? "same" : "changed", text: fa === fb ? "same" : "changed"})));
  for (const [label, va, vb, kind, key, notes] of compareRows(a, b)) {
    const delta = va === null || va === undefined || vb === null || vb === undefined ? null : vb - va;
    const cls = delta === null || delta === 0 ? "same" : (delta > 0) === (key !== "usable") ? "worse" : "better";
    t.append(el("tr", {"data-row": key},
      el("th", {scope: "row", text: label}),
      el("td", {"data-value": va ?? "", text: shown(va, kind) + (notes && notes[0] ? " · " + notes[0] : "")}),
      el("td", {"data-value": vb ?? "", text: shown(vb, kind) + (notes && notes[1] ? " · " + notes[1] : "")}),
      el("td", {class: "delta " + cls, "data-delta": delta ?? "", text: signed(delta, kind)})));
  }
  box.replaceChildren(
    el("p", {class: "note", id: "compare-diff", text: diff.length ? "changed: " + diff.join(" · ") : "the same scenario: change an input"}),
    el("div", {class: "scroll"}, t));
}

function wireCompare() {
  $("pin").addEventListener("click", pin);
  $("unpin").addEventListener("click", unpin);
  $("restore-pin").addEventListener("click", restorePinned);
  $("print").addEventListener("click", () => window.print());
}
