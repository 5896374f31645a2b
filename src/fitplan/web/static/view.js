// fitplan serve's page, the rendering: the answer line, the memory chart and table, the GPU cards, time and
// cost, advice, downloads, and the derivation popover. Every figure is one of /api/view's, /api/prices' or
// /api/largest's (docs/serve.md); this file only formats, sorts and picks (the cheapest of the listed prices).
"use strict";

const PHASES = [["forward", "forward"], ["backward", "backward"], ["optimizer_step", "optimizer step"]];
const SVG = "http://www.w3.org/2000/svg";
const COLOURS = 12;          // .c0 … .c11: a component keeps its colour (its index in /api/view's rows) in every scenario
const CHART_FONT_PX = 12;
let chartWidth = 0;          // the chart's on-screen width, measured at the first render and after a resize    // the chart is drawn at its on-screen width, so its text is never smaller than this

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") e.textContent = v; else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

function svg(tag, attrs = {}, text = null) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) e.setAttribute(k, v);
  if (text !== null) e.textContent = text;
  return e;
}

// ------------------------------------------------------------------ numbers (formatting only)

const UNITS = {GB: 1e9, GiB: 2 ** 30};
let unit = "GB";

function gb(bytes) {
  if (bytes === null || bytes === undefined) return "–";
  return (bytes / UNITS[unit]).toLocaleString("en-US", {minimumFractionDigits: 2, maximumFractionDigits: 2}) + " " + unit;
}
function gbShort(bytes) {  // the answer line: "48.7 of 85.0 GB"
  return (bytes / UNITS[unit]).toLocaleString("en-US", {minimumFractionDigits: 1, maximumFractionDigits: 1});
}
function count(n) {
  if (n >= 1e9) return (n / 1e9).toFixed(2) + "B";
  if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
  return String(n);
}
function money(v, currency) {
  if (v === null || v === undefined) return "–";
  return (currency === "USD" || !currency ? "$" : currency + " ") +
    v.toLocaleString("en-US", {minimumFractionDigits: 2, maximumFractionDigits: 2});
}
function hours(seconds) {  // minutes below an hour, days from two days on
  if (seconds === null || seconds === undefined) return "–";
  if (seconds >= 2 * 86400) return (seconds / 86400).toFixed(1) + " days";
  return seconds >= 3600 ? (seconds / 3600).toFixed(2) + " h" : (seconds / 60).toFixed(1) + " min";
}

// A confidence band, if the report gives one for `key` (time.seconds, cost.on_demand_usd): `key_band`,
// `key_range`, `key_interval` ([low, high] or {low, high}), `key_low` / `key_high`, or `band` for seconds.
function band(section, key) {
  if (!section) return null;
  let b = section[key + "_band"] ?? section[key + "_range"] ?? section[key + "_interval"] ??
    (key === "seconds" ? section.band ?? section.interval : undefined);
  if (b === undefined && section[key + "_low"] !== undefined) b = [section[key + "_low"], section[key + "_high"]];
  if (!b) return null;
  if (Array.isArray(b)) return b.length >= 2 ? [b[0], b[b.length - 1]] : null;
  const lo = b.low ?? b.lo ?? b.min ?? b.p10, hi = b.high ?? b.hi ?? b.max ?? b.p90;
  return lo !== undefined && hi !== undefined && lo !== null && hi !== null ? [lo, hi] : null;
}
function withBand(text, b, fmt) {
  return b ? `${text} (band ${fmt(b[0])} – ${fmt(b[1])})` : text;
}

// A number that opens its derivation: focusable, Enter or Space opens it (wireDerivations).
function num(text, attrs) {
  const explainable = attrs && attrs["data-explain"];
  return el("span", {class: "num", ...attrs, tabindex: explainable ? "0" : null, role: explainable ? "button" : null,
    "aria-haspopup": explainable ? "dialog" : null, text});
}

// ------------------------------------------------------------------ the answer line

// The cheapest priced provider row of /api/view (null when none is priced).
function cheapest(providers) {
  let best = null;
  for (const p of providers || []) {
    const v = p.cost && p.cost.on_demand_usd;
    if (v !== null && v !== undefined && (best === null || v < best.cost.on_demand_usd)) best = p;
  }
  return best;
}

function noFitReason(est) {
  const mem = est.memory, per = mem.per_gpu_bytes;
  return `does not fit: needs ${gb(per.device_total)} of ${gb(mem.usable_bytes)} on ${est.gpu.name}`;
}

// The headline's text for the view `d` and, once it has come, /api/largest's answer `largest`.
function answerText(d, largest) {
  const est = d.estimate, mem = est.memory, gpu = est.gpu;
  if (!gpu) return "choose a GPU to see whether it fits";
  const per = mem.per_gpu_bytes;
  const memory = `${gbShort(per.device_total)} of ${gbShort(mem.usable_bytes)} ${unit}`;
  if (!mem.fits) {
    const mb = largest && largest["micro-batch"];
    let fix;
    if (mb && mb.largest) fix = `largest micro-batch that fits: ${mb.largest}`;
    else if (est.advice === null) fix = "finding what to change…";  // the advice is on its way (/api/advice)
    else if (est.advice.length) fix = suggestion(est.advice[0]);
    else if (mb && !mb.error) fix = "even micro-batch 1 does not fit: a larger GPU, more GPUs with ZeRO/FSDP, or LoRA/QLoRA";
    else fix = "finding the largest micro-batch that fits…";
    return `does not fit · ${memory} · ${fix}`;
  }
  const parts = ["fits", memory];
  if (est.time) parts.push(hours(est.time.seconds));
  const chosen = est.cost && est.cost.provider ? d.providers.find((p) => p.id === est.cost.provider) : null;
  const best = cheapest(d.providers);
  if (chosen && chosen.cost) {
    const note = best && best.id !== chosen.id ? ` (cheapest: ${money(best.cost.on_demand_usd, best.cost.currency)} on ${best.id})`
      : ", cheapest";
    parts.push(`${money(chosen.cost.on_demand_usd, chosen.cost.currency)} on ${chosen.id}${note}`);
  } else if (best) {
    parts.push(`${money(best.cost.on_demand_usd, best.cost.currency)} on ${best.id}, cheapest`);
  } else if (!est.time) {
    parts.push("give the dataset size for time and cost");
  }
  return parts.join(" · ");
}

// An advice in a few words: the flags of its variant ("try --optim adamw_8bit"), else its message.
function suggestion(a) {
  const byField = Object.fromEntries(FIELDS.map((f) => [f.field, f.name]));
  const changes = Object.entries(a.variant || {}).filter(([k, v]) => byField[k] && typeof v !== "object");
  return changes.length ? "try " + changes.map(([k, v]) => `--${byField[k]} ${v}`).join(" ") + " (see Advice)" : a.message;
}

function renderAnswer(d, largest) {
  const est = d.estimate, mem = est.memory, gpu = est.gpu;
  const v = $("verdict");
  v.dataset.fits = !gpu || mem.fits === null || mem.fits === undefined ? "" : String(mem.fits);
  v.textContent = !gpu ? "no GPU" : mem.fits ? `fits ${gpu.name}` : `does not fit ${gpu.name}`;
  $("headline").textContent = answerText(d, largest);
  $("summary").textContent = `${est.model.name} · ${count(est.model.param_count)} params` +
    ` (${count(est.model.trainable_param_count)} trainable) · ${est.world_size} GPU${est.world_size > 1 ? "s" : ""}`;
}

// The header after an error: nothing derived from the previous scenario stays.
function clearAnswer(text) {
  $("verdict").dataset.fits = "";
  $("verdict").textContent = "error";
  $("headline").textContent = text;
  $("summary").textContent = "";
}

function render(d) {
  renderAnswer(d, null);
  renderChart(d);
  renderComponents(d);
  renderGpus(d, null);
  renderTime(d);
  renderAdvice(d.estimate);
  renderExports(d);
  renderCompare(d);
}

// ------------------------------------------------------------------ memory

function colour(d, key) {
  return "c" + (Math.max(d.rows.findIndex((r) => r.key === key), 0) % COLOURS);
}

function renderChart(d) {
  const mem = d.estimate.memory, per = mem.per_gpu_bytes, phases = mem.phases_bytes || {};
  const atPeak = mem.peak_breakdown_bytes || {};
  const comps = d.rows.filter((r) => !r.overhead && atPeak[r.key] > 0);
  const overhead = d.rows.find((r) => r.overhead);
  const max = Math.max(per.device_total || 0, mem.usable_bytes || 0, ...Object.values(phases)) * 1.04 || 1;
  if (!chartWidth) chartWidth = Math.round($("chart").clientWidth || 760);  // read once: a layout read costs a reflow
  const W = Math.max(chartWidth, 300), narrow = W < 560;
  const L = narrow ? 92 : 150, H = 28, G = 14, top = 22;
  const x = (b) => L + (b / max) * (W - L - 12);
  const rows = 2 + PHASES.length;
  const bottom = top + rows * (H + G);
  const s = svg("svg", {viewBox: `0 0 ${W} ${bottom}`, width: W, height: bottom, role: "img", class: "memory",
    "aria-label": "memory per GPU: the peak's composition, each phase, and the device total against the usable memory"});
  const label = (i, text) => s.append(svg("text", {x: L - 6, y: top + i * (H + G) + H * 0.66, class: "label",
    "text-anchor": "end"}, text));
  const bar = (i, from, bytes, cls, explain, key, title, inside = title.split(":")[0]) => {
    const width = Math.max(x(from + bytes) - x(from), 0.5);
    const r = svg("rect", {x: x(from), y: top + i * (H + G), width, height: H, class: cls, "data-explain": explain,
      "data-key": key, "data-bytes": bytes});
    r.append(svg("title", {}, title));
    s.append(r);
    if (width > inside.length * CHART_FONT_PX * 0.6 + 10) s.append(svg("text", {x: x(from) + 5,
      y: top + i * (H + G) + H * 0.66, class: "inbar", "data-explain": explain}, inside));
  };
  label(0, narrow ? "at peak" : "at the peak");
  let at = 0;
  for (const r of comps) {
    bar(0, at, atPeak[r.key], colour(d, r.key), r.quantity, r.key, `${r.label} at the peak: ${gb(atPeak[r.key])}`, r.label);
    at += atPeak[r.key];
  }
  PHASES.forEach(([key, name], k) => {
    if (phases[key] === undefined) return;
    const peak = key === mem.peak_phase;
    label(k + 1, narrow ? name.replace("optimizer ", "optim. ") : name + (peak ? " (peak)" : ""));
    bar(k + 1, 0, phases[key], peak ? "phase peak" : "phase", d.explain.peak, "phase:" + key, `${name}: ${gb(phases[key])}`,
      gb(phases[key]));
  });
  const i = PHASES.length + 1;
  label(i, narrow ? "device" : "device total");
  bar(i, 0, per.peak, "phase peak", d.explain.peak, "peak", `peak: ${gb(per.peak)}`, `peak ${gb(per.peak)}`);
  if (overhead && per[overhead.key]) {
    bar(i, per.peak, per[overhead.key], "overhead", overhead.quantity, overhead.key, `${overhead.label}: ${gb(per[overhead.key])}`,
      narrow ? "+" : overhead.label);
  }
  if (mem.usable_bytes) usableMark(s, d, x(mem.usable_bytes), rows, {top, H, G, W});
  $("chart").replaceChildren(s);
}

// The usable memory: dashes in the gaps between the bars (never across a bar or its label) and a label on top.
function usableMark(s, d, ux, rows, {top, H, G, W}) {
  const mem = d.estimate.memory, over = mem.per_gpu_bytes.device_total > mem.usable_bytes;
  for (let k = 0; k <= rows; k++) {
    const y0 = k === 0 ? 14 : top + k * (H + G) - G, y1 = k === 0 ? top : top + k * (H + G);
    s.append(svg("line", {x1: ux, x2: ux, y1: y0, y2: y1, class: over ? "usable over" : "usable"}));
  }
  s.append(svg("text", {x: Math.min(ux, W - 4), y: 11, class: "usable-label", "text-anchor": ux > W / 2 ? "end" : "start",
    "data-explain": d.explain.usable}, `usable ${gb(mem.usable_bytes)}`));
}

function renderComponents(d) {
  const mem = d.estimate.memory, per = mem.per_gpu_bytes, atPeak = mem.peak_breakdown_bytes || {};
  const t = $("components");
  t.replaceChildren(el("tr", {}, el("th", {text: "component"}), el("th", {text: "largest"}), el("th", {text: "at the peak"})));
  for (const r of d.rows.filter((r) => !r.overhead && per[r.key] > 0)) {
    t.append(el("tr", {},
      el("th", {scope: "row"}, el("i", {class: "swatch " + colour(d, r.key)}), r.label),
      el("td", {}, num(gb(per[r.key]), {"data-explain": r.quantity, "data-bytes": per[r.key], id: "row-" + r.key})),
      el("td", {text: gb(atPeak[r.key] ?? 0)})));
  }
  const phase = PHASES.find(([k]) => k === mem.peak_phase);
  const total = (text, value, attrs, extra = "") => t.append(el("tr", {class: "total"}, el("th", {scope: "row", text}),
    el("td", {}, num(gb(value), {"data-bytes": value, ...attrs})), el("td", {text: extra})));
  total(`peak (at ${phase ? phase[1] : mem.peak_phase})`, per.peak, {"data-explain": d.explain.peak, id: "peak"});
  const overhead = d.rows.find((r) => r.overhead);  // the chart's last bar, reachable by keyboard here
  if (overhead && per[overhead.key]) t.append(el("tr", {},
    el("th", {scope: "row"}, el("i", {class: "swatch overhead"}), "+ " + overhead.label),
    el("td", {}, num(gb(per[overhead.key]), {"data-explain": overhead.quantity, "data-bytes": per[overhead.key],
      id: "row-" + overhead.key})), el("td", {})));
  total("device total (peak + CUDA context + reserve)", per.device_total,
    {"data-explain": d.explain.device_total, id: "device-total"});
  if (mem.usable_bytes) total(`usable on ${d.estimate.gpu.name}`, mem.usable_bytes,
    {"data-explain": d.explain.usable, id: "usable"}, `headroom ${gb(mem.headroom_bytes)}`);
}

// ------------------------------------------------------------------ GPUs, largest, time and cost

// GPU cards, sorted fits first, then by cost (once /api/prices has answered), then by memory.
function renderGpus(d, prices) {
  $("gpus").dataset.cards = d.gpus === null ? "pending" : "ready";
  if (d.gpus === null) {  // on its way (/api/gpus): priced once both are in
    $("gpus").dataset.priced = "pending";
    $("gpus").replaceChildren(el("p", {class: "note", text: "placing the scenario on every GPU…"}));
    return;
  }
  const chosen = d.estimate.gpu ? d.estimate.gpu.id : null;
  const rows = d.gpus.map((g) => ({g, fits: g.memory ? g.memory.fits : null, price: prices ? prices[g.id] : undefined}));
  const cost = (r) => r.price && r.price.cost ? r.price.cost.on_demand_usd : Infinity;
  rows.sort((a, b) => (b.fits === true) - (a.fits === true) || cost(a) - cost(b) ||
    (b.g.usable_bytes || 0) - (a.g.usable_bytes || 0));
  $("gpus").dataset.priced = prices ? "true" : "false";
  $("gpus").replaceChildren(...rows.map(({g, fits, price}) => {
    const m = g.memory;
    let priceText = prices === null ? "pricing…" : "", priceTitle = "";
    if (price && price.cost) {
      priceText = `${money(price.cost.on_demand_usd, price.cost.currency)} · ${hours(price.time && price.time.seconds)} · ${price.provider}`;
      if (fits === false) priceTitle = `not a plan: ${g.name} does not fit this run (${gb(m.per_gpu_bytes.device_total)} of ${gb(m.usable_bytes)})`;
    } else if (price && price.error) priceText = "no provider rents it";
    const b = el("button", {type: "button", class: "gpu" + (g.id === chosen ? " selected" : ""), "data-gpu": g.id,
      "data-fits": fits === null ? "" : String(fits), "aria-pressed": g.id === chosen ? "true" : "false",
      title: g.error || `${g.name}: ${g.ruleset || ""}`},
      el("b", {text: g.name}),
      el("span", {class: "verdict-small", text: g.error ? "cannot run" : fits ? "fits" : "does not fit"}),
      el("small", {text: m ? `${gb(m.per_gpu_bytes.device_total)} of ${gb(m.usable_bytes)}` : (g.error || "")}),
      el("span", {class: "price" + (fits === false ? " nofit" : ""), title: priceTitle || null, text: priceText}));
    b.addEventListener("click", () => setField("gpu", g.id));
    return b;
  }));
}

function renderLargest(largest) {
  const box = $("largest");
  if (!largest) { box.replaceChildren(el("p", {class: "note", text: "Choose a GPU to find the largest micro-batch and sequence that fit."})); return; }
  const names = {"micro-batch": ["per-device-train-batch-size", "micro-batch"], "seq-length": ["max-seq-length", "sequence length"]};
  box.replaceChildren(...Object.entries(largest).map(([what, r]) => {
    const [flag, name] = names[what] || [what, what];
    if (r.error) return el("p", {text: `${name}: ${r.error}`});
    const p = el("p", {id: "largest-" + what},
      el("b", {text: `${name}: `}),
      r.largest ? num(String(r.largest), {"data-value": r.largest}) : el("span", {text: "even 1 does not fit"}),
      el("small", {text: r.largest ? ` (device total ${gb(r.device_total)}; ${r.next_value ?? "more"} needs ` +
        `${gb(r.next_device_total_bytes)} of ${gb(r.usable)} on ${r.gpu})` : ` (1 needs ${gb(r.next_device_total_bytes)} of ${gb(r.usable)})`}));
    if (r.largest) {
      const use = el("button", {type: "button", class: "small", text: "use", "aria-label": `use ${name} ${r.largest}`});
      use.addEventListener("click", () => setField(flag, r.largest));
      p.append(" ", use);
    }
    return p;
  }));
}

function renderTime(d) {
  const est = d.estimate, t = est.time, fits = est.memory.fits !== false;
  if (!t) {
    $("time").replaceChildren(el("p", {class: "note", text: "Give the dataset size (examples and tokens per example, " +
      "or total tokens) to estimate time and cost."}));
    $("providers").replaceChildren();
    return;
  }
  $("time").replaceChildren(el("p", {class: fits ? null : "nofit"},
    el("b", {text: "time: "}),
    num(withBand(hours(t.seconds), band(t, "seconds"), hours), {"data-explain": d.explain.seconds, id: "time-value"}),
    el("span", {text: ` · ${Math.round(t.tokens_per_second).toLocaleString("en-US")} tokens/s · ${t.throughput_basis || ""}`})),
    fits ? "" : el("p", {class: "nofit-reason", id: "nofit-cost", text: noFitReason(est) + ": these prices are for a run that would stop out of memory."}));
  const priced = d.providers.filter((p) => p.cost).sort((a, b) => (a.cost.on_demand_usd ?? Infinity) - (b.cost.on_demand_usd ?? Infinity));
  const rows = [...priced, ...d.providers.filter((p) => !p.cost)].map((p) => providerRow(d, p, fits));
  $("providers").classList.toggle("nofit", !fits);
  $("providers").replaceChildren(el("tr", {}, el("th", {text: "provider"}), el("th", {text: "on demand"}),
    el("th", {text: "spot"}), el("th", {text: "time"}), el("th", {text: "instances"})), ...rows);
}

function providerRow(d, p, fits) {
  const c = p.cost, est = d.estimate;
  if (!c) return el("tr", {class: "unavailable", title: p.error || ""}, el("td", {text: p.id}),
    el("td", {colspan: 4, text: p.error ? p.error.split(" @ ")[0] : "no price"}));
  const selected = est.cost && est.cost.provider === p.id;
  const choose = el("button", {type: "button", class: "link", "aria-pressed": selected ? "true" : "false",
    title: `price the scenario with --provider ${p.id}`, text: p.id});
  choose.addEventListener("click", () => setField("provider", p.id));
  return el("tr", {class: "provider" + (selected ? " selected" : ""), "data-provider": p.id},
    el("td", {}, choose),
    el("td", {}, num(withBand(money(c.on_demand_usd, c.currency), band(c, "on_demand_usd"), (v) => money(v, c.currency)),
      {"data-explain": d.explain["cost.on_demand"]})),
    el("td", {}, num(money(c.spot_usd, c.currency), {"data-explain": c.spot_usd === null ? null : d.explain["cost.spot"]})),
    el("td", {text: hours(p.time ? p.time.seconds : null)}),
    el("td", {text: `${c.instance_count} × ${c.instance}${c.region ? " (" + c.region + ")" : ""}`}));
}

function renderAdvice(est) {
  const byField = Object.fromEntries(FIELDS.map((f) => [f.field, f.name]));
  $("advice").dataset.state = est.advice === null ? "pending" : "ready";
  $("advice").replaceChildren(...(est.advice || []).map((a) => {
    const li = el("li", {"data-advice": a.id}, el("span", {text: a.message}));
    const changes = Object.entries(a.variant || {}).filter(([k, v]) => byField[k] && typeof v !== "object");
    if (changes.length) {
      const b = el("button", {type: "button", class: "small", text: "apply",
        title: changes.map(([k, v]) => `--${byField[k]} ${v}`).join(" ")});
      b.addEventListener("click", () => { for (const [k, v] of changes) writeField(byField[k], v); changed(); });
      li.append(" ", b);
    }
    return li;
  }));
  if (est.advice === null) $("advice").append(el("li", {class: "note", text: "finding advice…"}));
  else if (!est.advice.length) $("advice").append(el("li", {class: "note", text: "No advice for this scenario."}));
  $("warnings").replaceChildren(...est.warnings.map((w) => el("li", {text: "warning: " + w})));
  $("policy").replaceChildren(...(est.policy || []).map((p) =>
    el("li", {text: `policy ${p.rule} (${p.action}${p.market ? ", " + p.market : ""}): ${p.reason}`})));
}

// Downloads: each file the scenario has; none while the run does not fit (greyed, with the reason).
function renderExports(d) {
  const qs = lastQuery, est = d.estimate, fits = est.memory.fits !== false;
  const q = qs ? "?" + qs : "";  // the estimate's exports: also for a run that does not fit (it says so)
  $("estimate-exports").replaceChildren(
    el("a", {class: "button", href: "/api/estimate" + q, download: "fitplan-estimate.json", "data-export": "json",
      text: "fitplan-estimate.json"}),
    el("a", {class: "button", href: "/api/estimate.csv" + q, download: "fitplan-estimate.csv", "data-export": "csv",
      text: "fitplan-estimate.csv"}));
  $("exports").replaceChildren(...d.exports.kinds.map((k) => {
    const why = [fits ? null : noFitReason(est), k.error].filter(Boolean).join("; ");
    return why ? el("span", {class: "button disabled", role: "link", "aria-disabled": "true", title: why,
      "data-export": k.kind, text: k.file})
      : el("a", {class: "button", href: `/api/export?kind=${k.kind}${qs ? "&" + qs : ""}`, download: k.file,
        "data-export": k.kind, text: k.file});
  }));
  const notes = fits ? d.exports.notes : [noFitReason(est) + ": change the scenario first (see the answer above).",
    ...d.exports.notes];
  $("export-notes").replaceChildren(...notes.map((n) => el("li", {text: n})));
}

// ------------------------------------------------------------------ derivations

// "{a: 1 GB, b: {c: 2}}" -> [["a", "1 GB"], ["b", "{c: 2}"]]: the report's mapping values, one line each.
function entries(text) {
  if (typeof text !== "string" || !text.startsWith("{") || !text.endsWith("}")) return null;
  const out = [];
  let depth = 0, start = 1;
  for (let i = 1; i < text.length - 1; i++) {
    const c = text[i];
    if ("{[(".includes(c)) depth++;
    else if ("}])".includes(c)) depth--;
    else if (c === "," && depth === 0) { out.push(text.slice(start, i).trim()); start = i + 1; }
  }
  out.push(text.slice(start, text.length - 1).trim());
  return out.filter(Boolean).map((part) => { const k = part.indexOf(": "); return k < 0 ? [part, ""] : [part.slice(0, k), part.slice(k + 2)]; });
}

// A docstring as text with ``code`` spans (no RST backticks shown).
function prose(doc) {
  const p = el("div", {class: "doc"});
  doc.replace(/\s*\n\s*/g, " ").split(/``([^`]+)``/).forEach((part, i) => p.append(i % 2 ? el("code", {text: part}) : part));
  return p;
}

function valueNode(value) {
  const kv = entries(value);
  if (!kv) return el("span", {class: "value", text: value});
  return el("ul", {class: "values"}, ...kv.map(([k, v]) => el("li", {}, el("span", {class: "key", text: k + " = "}),
    valueNode(v))));
}

function treeNode(n) {
  const inline = entries(n.value) === null;
  const head = el("div", {class: "line"}, el("b", {text: n.name}), inline ? el("span", {text: " = "}) : null,
    inline ? el("span", {class: "value", text: n.value}) : null,
    el("small", {text: ` · ${n.kind}${n.applied !== undefined ? (n.applied ? ", applied" : ", not applied") : ""}` +
      `${n.ruleset ? " · " + n.ruleset : ""}`}));
  const body = [inline ? null : valueNode(n.value), n.doc ? prose(n.doc) : null];
  if (!n.children || !n.children.length) return el("li", {}, head, ...body);
  return el("li", {}, el("details", {open: true}, el("summary", {}, head), ...body, el("ul", {}, ...n.children.map(treeNode))));
}
