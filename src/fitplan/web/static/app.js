// fitplan serve's page: a form built from /api/options, re-estimated through /api/view on every change.
// The address holds the whole scenario (the CLI's long flag names as query parameters), so a link reproduces
// the view. Nothing here computes a number: every figure shown is one of /api/view's (docs/serve.md).
"use strict";

const EXAMPLE = "model=llama-2-7b&gpu=a100-80gb&precision=bf16-mixed&per-device-train-batch-size=4" +
  "&gradient-checkpointing=true&num-examples=10000&tokens-per-example=512";
const DEBOUNCE_MS = 30, TYPING_MS = 400;  // typing a name waits for a pause
// The largest micro-batch and sequence (tens of evaluations the server cannot cancel) wait until the inputs
// have been still this long, so that they never hold up the next re-estimate while a slider moves.
const LARGEST_DELAY_MS = 250;
const SECTIONS = {model: "Model", training: "Training", lora: "LoRA (method lora or qlora)",
  parallel: "Sharding and parallelism", hardware: "Hardware", dataset: "Dataset", cost: "Time and cost"};
const MORE = new Set(["params", "assumptions", "tf32", "num-train-epochs", "lora-dropout", "bnb-4bit-use-double-quant",
  "tensor-parallel", "device", "padding", "total-tokens", "instance", "region", "runs", "tokens-per-second", "mfu",
  "throughput-source"]);
const LABELS = {"model": "model", "per-device-train-batch-size": "micro-batch", "max-seq-length": "sequence length",
  "gradient-accumulation-steps": "accumulation steps", "attn-implementation": "attention kernel", "optim": "optimizer",
  "zero": "ZeRO stage", "fsdp": "FSDP", "num-gpus": "GPUs per node", "num-nodes": "nodes", "gpu": "GPU",
  "num-examples": "examples", "tokens-per-example": "tokens per example", "provider": "provider"};
const HELP = {"model": "A catalog name, a Hub id (ORG/NAME, from the local Hugging Face cache), or drop a config.json."};
const SLIDERS = {"per-device-train-batch-size": {min: 1, max: 64, log2: false},
  "max-seq-length": {min: 7, max: 17, log2: true}};
const PHASES = [["forward", "forward"], ["backward", "backward"], ["optimizer_step", "optimizer step"]];
const SVG = "http://www.w3.org/2000/svg";

let FIELDS = [];            // /api/options fields
let GPUS = {};              // id -> GPU row
let extra = [];             // query pairs that are not form fields (kept, so the server can judge them)
let timer = null, largestTimer = null, inflight = null, lastQuery = null;

const $ = (id) => document.getElementById(id);
const form = () => $("form");

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

function gb(bytes) {
  if (bytes === null || bytes === undefined) return "–";
  return (bytes / 1e9).toLocaleString("en-US", {minimumFractionDigits: 2, maximumFractionDigits: 2}) + " GB";
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
function hours(seconds) {
  if (seconds === null || seconds === undefined) return "–";
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
  return lo !== undefined && hi !== undefined ? [lo, hi] : null;
}
function withBand(text, b, fmt) {
  return b ? `${text} (band ${fmt(b[0])} – ${fmt(b[1])})` : text;
}

// ------------------------------------------------------------------ the form

function defaultText(f) {
  if (f.default === null || f.default === undefined) return "";
  return String(f.default);
}

function widget(f) {
  const title = `--${f.name}: ${HELP[f.name] || f.help || ""}`;
  if (f.type === "boolean") return el("input", {type: "checkbox", name: f.name, id: "f-" + f.name, title});
  if (f.choices) {
    const s = el("select", {name: f.name, id: "f-" + f.name, title});
    if (f.default === null) s.append(el("option", {value: "", text: f.name === "provider" ? "none (all below)" : "–"}));
    for (const c of f.choices) {
      const g = f.name === "gpu" ? GPUS[c] : null;
      s.append(el("option", {value: String(c), text: g ? `${g.name} (${gb(g.usable_bytes)})` : String(c)}));
    }
    return s;
  }
  const attrs = {name: f.name, id: "f-" + f.name, title, type: f.type === "text" ? "text" : "number"};
  if (f.type === "integer") Object.assign(attrs, {step: 1, min: f.name === "zero" ? 0 : 1});
  if (f.type === "float") attrs.step = "any";
  if (f.name === "model") Object.assign(attrs, {list: "catalog", placeholder: "llama-2-7b, ORG/NAME or upload:…"});
  return el("input", attrs);
}

function slider(f, input) {
  const spec = SLIDERS[f.name];
  const r = el("input", {type: "range", min: spec.min, max: spec.max, step: 1, id: "s-" + f.name,
    "aria-label": (LABELS[f.name] || f.name) + " slider"});
  r.addEventListener("input", () => {
    input.value = spec.log2 ? String(2 ** Number(r.value)) : r.value;
    changed();
  });
  return r;
}

function syncSliders() {
  for (const [name, spec] of Object.entries(SLIDERS)) {
    const r = $("s-" + name), v = Number(form().elements[name].value || 0);
    if (r && v > 0) r.value = spec.log2 ? Math.round(Math.log2(v)) : Math.min(v, spec.max);
  }
}

function buildForm() {
  const box = $("fields");
  const bySection = {};
  for (const f of FIELDS) (bySection[f.section] ||= []).push(f);
  for (const [section, title] of Object.entries(SECTIONS)) {
    const fs = el("fieldset", {id: "fs-" + section}, el("legend", {text: title}));
    const more = el("details", {}, el("summary", {text: "more"}));
    for (const f of bySection[section] || []) {
      const input = widget(f);
      const row = el("label", {class: "field", "data-name": f.name, title: input.getAttribute("title")},
        el("span", {class: "name", text: LABELS[f.name] || f.name.replaceAll("-", " ")}), input);
      if (SLIDERS[f.name]) row.append(slider(f, input));
      (MORE.has(f.name) ? more : fs).append(row);
    }
    if (more.children.length > 1) fs.append(more);
    box.append(fs);
  }
  form().addEventListener("input", (e) => {
    if (e.target.type !== "range" && e.target.type !== "file") changed(e.target.type === "text" ? TYPING_MS : DEBOUNCE_MS);
  });
  form().addEventListener("change", (e) => { if (e.target.type === "text") changed(); });
  form().addEventListener("submit", (e) => { e.preventDefault(); changed(); });
}

function writeForm(params) {
  const known = new Set(FIELDS.map((f) => f.name));
  for (const f of FIELDS) {
    const e = form().elements[f.name], v = params.has(f.name) ? params.get(f.name) : defaultText(f);
    if (f.type === "boolean") e.checked = ["true", "1", "yes", "on"].includes(v.toLowerCase());
    else e.value = v;
    if (e.tagName === "SELECT" && e.value !== v) {  // a value the rulesets do not list: the server will say why
      e.append(el("option", {value: v, text: v}));
      e.value = v;
    }
  }
  extra = [...params].filter(([k]) => !known.has(k));
  syncSliders();
}

function readForm() {
  const q = new URLSearchParams();
  for (const f of FIELDS) {
    const e = form().elements[f.name];
    const v = f.type === "boolean" ? String(e.checked) : e.value.trim();
    if (v !== "" && v !== defaultText(f)) q.append(f.name, v);
  }
  for (const [k, v] of extra) q.append(k, v);
  return q.toString();
}

function setField(name, value) {
  const e = form().elements[name];
  if (!e) return;
  if (e.type === "checkbox") e.checked = value === true || value === "true"; else e.value = String(value);
  syncSliders();
  changed();
}

function changed(delay = DEBOUNCE_MS) {
  syncSliders();
  const qs = readForm();
  history.replaceState(null, "", qs ? "?" + qs : location.pathname);
  $("fs-lora")?.classList.toggle("inactive", form().elements["method"].value === "full");
  clearTimeout(timer);
  timer = setTimeout(() => load(qs), delay);
}

// ------------------------------------------------------------------ fetching

async function getJSON(url, signal) {
  const r = await fetch(url, {signal, headers: {Accept: "application/json"}});
  const data = await r.json();
  if (!r.ok) throw new Error(data.error || r.statusText);
  return data;
}

async function load(qs) {
  clearTimeout(largestTimer);
  if (inflight) inflight.abort();
  inflight = new AbortController();
  document.body.dataset.state = "loading";
  try {
    const signal = inflight.signal;
    const data = await getJSON("/api/view?" + qs, signal);
    lastQuery = qs;
    render(data);
    showError(null);
    document.body.dataset.query = qs;
    document.body.dataset.state = "ready";
    clearTimeout(largestTimer);
    largestTimer = setTimeout(() => loadLargest(qs, signal), LARGEST_DELAY_MS);
  } catch (e) {
    if (e.name === "AbortError") return;
    showError(e.message);
    document.body.dataset.state = "error";
  }
}

async function loadLargest(qs, signal) {
  $("largest").dataset.state = "loading";
  $("largest").classList.add("stale");
  try {
    const data = await getJSON("/api/largest?" + qs, signal);
    renderLargest(data);
    $("largest").dataset.state = "ready";
    $("largest").dataset.query = qs;
  } catch (e) {
    if (e.name === "AbortError") return;
    $("largest").replaceChildren(el("p", {class: "error", text: e.message}));
    $("largest").dataset.state = "error";
  }
  $("largest").classList.remove("stale");
}

function showError(text) {
  $("error").hidden = !text;
  $("error").textContent = text || "";
  $("results").classList.toggle("stale", !!text);
}

// ------------------------------------------------------------------ rendering

function render(d) {
  const est = d.estimate, mem = est.memory;
  const gpu = est.gpu;
  $("summary").textContent = `${est.model.name} · ${count(est.model.param_count)} params` +
    ` (${count(est.model.trainable_param_count)} trainable) · ${est.world_size} GPU${est.world_size > 1 ? "s" : ""}`;
  const v = $("verdict");
  v.dataset.fits = mem.fits === null || mem.fits === undefined ? "" : String(mem.fits);
  v.textContent = !gpu ? "choose a GPU" : mem.fits ? `fits ${gpu.name}` : `does not fit ${gpu.name}`;
  renderChart(d);
  renderComponents(d);
  renderGpus(d);
  renderTime(d);
  renderAdvice(est);
  renderExports(d);
}

function num(text, attrs) {
  return el("span", {class: "num", ...attrs, text});
}

function renderChart(d) {
  const mem = d.estimate.memory, per = mem.per_gpu_bytes, phases = mem.phases_bytes || {};
  const comps = d.rows.filter((r) => !r.overhead && per[r.key] > 0);
  const overhead = d.rows.find((r) => r.overhead);
  const total = comps.reduce((s, r) => s + per[r.key], 0);
  const max = Math.max(total, per.device_total || 0, mem.usable_bytes || 0, ...Object.values(phases)) * 1.04 || 1;
  const W = 760, L = 150, H = 28, G = 12, top = 22;
  const x = (b) => L + (b / max) * (W - L - 16);
  const rows = 2 + PHASES.length;
  const s = svg("svg", {viewBox: `0 0 ${W} ${top + rows * (H + G) + 6}`, role: "img", class: "memory",
    "aria-label": "memory per GPU by phase"});
  const label = (i, text) => s.append(svg("text", {x: L - 8, y: top + i * (H + G) + H * 0.68, class: "label",
    "text-anchor": "end"}, text));
  const bar = (i, from, bytes, cls, explain, key, title, inside = title.split(":")[0]) => {
    const r = svg("rect", {x: x(from), y: top + i * (H + G), width: Math.max(x(from + bytes) - x(from), 0.5), height: H,
      class: cls, "data-explain": explain, "data-key": key, "data-bytes": bytes});
    r.append(svg("title", {}, title));
    s.append(r);
    if (x(from + bytes) - x(from) > 70) s.append(svg("text", {x: x(from) + 5, y: top + i * (H + G) + H * 0.68,
      class: "inbar", "data-explain": explain}, inside));
  };
  label(0, "components");
  let at = 0;
  comps.forEach((r, k) => {
    bar(0, at, per[r.key], "c" + (k % 10), r.quantity, r.key, `${r.label}: ${gb(per[r.key])}`);
    at += per[r.key];
  });
  PHASES.forEach(([key, name], k) => {
    if (phases[key] === undefined) return;
    const peak = key === mem.peak_phase;
    label(k + 1, name + (peak ? " (peak)" : ""));
    bar(k + 1, 0, phases[key], peak ? "phase peak" : "phase", d.explain.peak, "phase:" + key, `${name}: ${gb(phases[key])}`,
      gb(phases[key]));
  });
  const i = PHASES.length + 1;
  label(i, "device total");
  bar(i, 0, per.peak, "phase peak", d.explain.peak, "peak", `peak: ${gb(per.peak)}`, `peak ${gb(per.peak)}`);
  if (overhead && per[overhead.key]) {
    bar(i, per.peak, per[overhead.key], "overhead", overhead.quantity, overhead.key, `${overhead.label}: ${gb(per[overhead.key])}`);
  }
  if (mem.usable_bytes) {
    const over = per.device_total > mem.usable_bytes;
    const ux = x(mem.usable_bytes);
    s.append(svg("line", {x1: ux, x2: ux, y1: 14, y2: top + rows * (H + G), class: over ? "usable over" : "usable"}));
    s.append(svg("text", {x: Math.min(ux, W - 4), y: 11, class: "usable-label", "text-anchor": "end",
      "data-explain": d.explain.usable}, `usable ${gb(mem.usable_bytes)}`));
  }
  $("chart").replaceChildren(s);
}

function renderComponents(d) {
  const mem = d.estimate.memory, per = mem.per_gpu_bytes;
  const t = $("components");
  t.replaceChildren(el("tr", {}, el("th", {text: "component"}), el("th", {text: "GB"}), el("th", {text: "share of peak"})));
  const comps = d.rows.filter((r) => !r.overhead && per[r.key] > 0);
  comps.forEach((r, k) => t.append(el("tr", {},
    el("td", {}, el("i", {class: "swatch c" + (k % 10)}), r.label),
    el("td", {}, num(gb(per[r.key]), {"data-explain": r.quantity, "data-bytes": per[r.key], id: "row-" + r.key})),
    el("td", {text: (100 * per[r.key] / Math.max(per.peak, 1)).toFixed(1) + " %"}))));
  const phase = PHASES.find(([k]) => k === mem.peak_phase);
  t.append(el("tr", {class: "total"}, el("td", {text: `peak (at ${phase ? phase[1] : mem.peak_phase})`}),
    el("td", {}, num(gb(per.peak), {"data-explain": d.explain.peak, "data-bytes": per.peak, id: "peak"})), el("td")));
  t.append(el("tr", {class: "total"}, el("td", {text: "device total (peak + CUDA context + reserve)"}),
    el("td", {}, num(gb(per.device_total), {"data-explain": d.explain.device_total, "data-bytes": per.device_total,
      id: "device-total"})), el("td")));
  if (mem.usable_bytes) t.append(el("tr", {class: "total"}, el("td", {text: `usable on ${d.estimate.gpu.name}`}),
    el("td", {}, num(gb(mem.usable_bytes), {"data-bytes": mem.usable_bytes, id: "usable"})),
    el("td", {text: `headroom ${gb(mem.headroom_bytes)}`})));
}

function renderGpus(d) {
  const chosen = d.estimate.gpu ? d.estimate.gpu.id : null;
  $("gpus").replaceChildren(...d.gpus.map((g) => {
    const m = g.memory;
    const fits = m ? m.fits : null;
    const b = el("button", {type: "button", class: "gpu" + (g.id === chosen ? " selected" : ""), "data-gpu": g.id,
      "data-fits": fits === null ? "" : String(fits), title: g.error || `${g.name}: ${g.ruleset || ""}`},
      el("b", {text: g.name}),
      el("span", {class: "verdict-small", text: g.error ? "cannot run" : fits ? "fits" : "does not fit"}),
      el("small", {text: m ? `${gb(m.per_gpu_bytes.device_total)} of ${gb(m.usable_bytes)}` : (g.error || "")}));
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
      const use = el("button", {type: "button", class: "small", text: "use"});
      use.addEventListener("click", () => setField(flag, r.largest));
      p.append(" ", use);
    }
    return p;
  }));
}

function renderTime(d) {
  const est = d.estimate, t = est.time;
  if (!t) {
    $("time").replaceChildren(el("p", {class: "note", text: "Give the dataset size (examples and tokens per example, " +
      "or total tokens) to estimate time and cost."}));
    $("providers").replaceChildren();
    return;
  }
  $("time").replaceChildren(el("p", {},
    el("b", {text: "time: "}),
    num(withBand(hours(t.seconds), band(t, "seconds"), hours), {"data-explain": d.explain.seconds, id: "time-value"}),
    el("span", {text: ` · ${Math.round(t.tokens_per_second).toLocaleString("en-US")} tokens/s · ${t.throughput_basis || ""}`})));
  const rows = d.providers.map((p) => {
    const c = p.cost;
    if (!c) return el("tr", {class: "unavailable", title: p.error || ""}, el("td", {text: p.id}),
      el("td", {colspan: 4, text: p.error ? p.error.split(" @ ")[0] : "no price"}));
    const tr = el("tr", {class: "provider" + (est.cost && est.cost.provider === p.id ? " selected" : ""), "data-provider": p.id},
      el("td", {text: p.id}),
      el("td", {text: `${c.instance_count} × ${c.instance}${c.region ? " (" + c.region + ")" : ""}`}),
      el("td", {}, num(withBand(money(c.on_demand_usd, c.currency), band(c, "on_demand_usd"), (v) => money(v, c.currency)),
        {"data-explain": d.explain["cost.on_demand"]})),
      el("td", {}, num(money(c.spot_usd, c.currency), {"data-explain": d.explain["cost.spot"]})),
      el("td", {text: hours(p.time ? p.time.seconds : null)}));
    tr.addEventListener("click", (e) => { if (!e.target.closest("[data-explain]")) setField("provider", p.id); });
    return tr;
  });
  $("providers").replaceChildren(el("tr", {}, el("th", {text: "provider"}), el("th", {text: "instances"}),
    el("th", {text: "on demand"}), el("th", {text: "spot"}), el("th", {text: "time"})), ...rows);
}

function renderAdvice(est) {
  const byField = Object.fromEntries(FIELDS.map((f) => [f.field, f.name]));
  $("advice").replaceChildren(...est.advice.map((a) => {
    const li = el("li", {"data-advice": a.id}, el("span", {text: a.message}));
    const changes = Object.entries(a.variant || {}).filter(([k, v]) => byField[k] && typeof v !== "object");
    if (changes.length) {
      const b = el("button", {type: "button", class: "small", text: "apply",
        title: changes.map(([k, v]) => `--${byField[k]} ${v}`).join(" ")});
      b.addEventListener("click", () => { for (const [k, v] of changes) form().elements[byField[k]][
        form().elements[byField[k]].type === "checkbox" ? "checked" : "value"] = v; changed(); });
      li.append(" ", b);
    }
    return li;
  }));
  if (!est.advice.length) $("advice").append(el("li", {class: "note", text: "No advice for this scenario."}));
  $("warnings").replaceChildren(...est.warnings.map((w) => el("li", {text: "warning: " + w})));
  $("policy").replaceChildren(...(est.policy || []).map((p) =>
    el("li", {text: `policy ${p.rule} (${p.action}${p.market ? ", " + p.market : ""}): ${p.reason}`})));
}

function renderExports(d) {
  const qs = lastQuery;
  $("exports").replaceChildren(...d.exports.kinds.map((k) => k.error
    ? el("span", {class: "button disabled", title: k.error, text: k.file})
    : el("a", {class: "button", href: `/api/export?kind=${k.kind}${qs ? "&" + qs : ""}`, download: k.file,
      "data-export": k.kind, text: k.file})));
  $("export-notes").replaceChildren(...d.exports.notes.map((n) => el("li", {text: n})));
}

// ------------------------------------------------------------------ derivation trees

function treeNode(n) {
  const head = el("span", {}, el("b", {text: n.name}), ` = ${n.value}`,
    el("small", {text: ` · ${n.kind}${n.applied !== undefined ? (n.applied ? ", applied" : ", not applied") : ""} · ${n.plugin}` +
      (n.ruleset ? ` · ${n.ruleset}` : "")}));
  const doc = n.doc ? el("div", {class: "doc", text: n.doc}) : null;
  if (!n.children || !n.children.length) return el("li", {}, head, doc);
  return el("li", {}, el("details", {open: true}, el("summary", {}, head), doc, el("ul", {}, ...n.children.map(treeNode))));
}

async function explain(quantity) {
  const box = $("explain");
  box.replaceChildren(el("p", {class: "note", text: `deriving ${quantity}…`}));
  try {
    const q = `quantity=${encodeURIComponent(quantity)}${lastQuery ? "&" + lastQuery : ""}`;
    const x = await getJSON("/api/explain?" + q);
    box.replaceChildren(el("ul", {class: "tree", "data-quantity": quantity}, treeNode(x.tree)),
      ...x.seed_differences.map((s) => el("p", {class: "note", text: "seed chapter: " + s})));
    $("explain-card").scrollIntoView({block: "nearest"});
  } catch (e) {
    box.replaceChildren(el("p", {class: "error", text: e.message}));
  }
}

// ------------------------------------------------------------------ uploads, links

async function upload(file) {
  const status = $("upload-status");
  status.textContent = `reading ${file.name}…`;
  try {
    const r = await fetch("/api/upload?filename=" + encodeURIComponent(file.name),
      {method: "POST", headers: {"Content-Type": "application/json"}, body: await file.text()});
    const data = await r.json();
    if (!r.ok) throw new Error(data.error);
    $("catalog").append(el("option", {value: data.model, label: `${data.name} (uploaded)`}));
    status.textContent = `uploaded ${data.name}: ${count(data.param_count)} params (link valid while this server runs)`;
    setField("model", data.model);
  } catch (e) {
    status.textContent = "";
    showError(e.message);
  }
}

function wireUploads() {
  const drop = $("drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer.files.length) upload(e.dataTransfer.files[0]);
  });
  $("file").addEventListener("change", (e) => { if (e.target.files.length) upload(e.target.files[0]); });
}

function wireLinks() {
  $("copy-link").addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(location.href);
      $("copy-link").textContent = "Link copied";
    } catch (e) {
      window.prompt("Copy this link:", location.href);
    }
    setTimeout(() => { $("copy-link").textContent = "Copy link"; }, 1500);
  });
  document.addEventListener("click", (e) => {
    const t = e.target.closest("[data-explain]");
    if (t && t.dataset.explain) explain(t.dataset.explain);
  });
}

async function main() {
  try {
    const [opts, models] = await Promise.all([getJSON("/api/options"), getJSON("/api/models")]);
    FIELDS = opts.fields;
    GPUS = Object.fromEntries(opts.gpus.map((g) => [g.id, g]));
    for (const m of models) $("catalog").append(el("option", {value: m.id, label: `${m.hf_id || m.id} · ${count(m.param_count)}`}));
  } catch (e) {
    showError("cannot load the form: " + e.message);
    return;
  }
  buildForm();
  wireUploads();
  wireLinks();
  const params = new URLSearchParams(location.search.length > 1 ? location.search : EXAMPLE);
  writeForm(params);
  changed();
}

main();
