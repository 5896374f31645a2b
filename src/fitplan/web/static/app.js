// fitplan serve's page: a form built from /api/options, re-estimated through /api/view on every change; then
// /api/prices (each GPU's cheapest rental) and /api/largest once the inputs are still, and last the cheapest
// plan's search (cheapest.js). The address holds the whole scenario (the CLI's long flag names as query
// parameters), so a link reproduces the view. Nothing here computes a number: every figure shown is one of the
// API's (docs/serve.md). Rendering is in view.js.
"use strict";

const EXAMPLE = "model=llama-2-7b&gpu=a100-80gb&precision=bf16-mixed&per-device-train-batch-size=4" +
  "&gradient-checkpointing=true&num-examples=10000&tokens-per-example=512";
const DEBOUNCE_MS = 30, TYPING_MS = 400;  // typing a name waits for a pause
// The GPU prices and the largest micro-batch and sequence (tens of evaluations the server cannot cancel) wait
// until the inputs have been still this long, so that they never hold up the next re-estimate.
const LATER_DELAY_MS = 250;
const SECTIONS = {model: "Model", training: "Training", lora: "LoRA (method lora or qlora)",
  parallel: "Sharding and parallelism", hardware: "Hardware", dataset: "Dataset", cost: "Time and cost",
  trl: "TRL trainer (preference and RL fine-tuning)"};
const MORE = new Set(["params", "assumptions", "tf32", "num-train-epochs", "lora-dropout", "bnb-4bit-use-double-quant",
  "tensor-parallel", "device", "padding", "total-tokens", "instance", "region", "runs", "tokens-per-second", "mfu",
  "throughput-source", "optim-args", "optim-target-modules", "torch-compile", "autocast-adapter-dtype",
  "bnb-4bit-compute-dtype", "kbit-preparation", "stack", "reduce-bucket-size", "overlap-comm",
  "stage3-prefetch-bucket-size", "stage3-param-persistence-threshold", "stage3-max-live-parameters",
  "stage3-max-reuse-distance", "sub-group-size", "dataset", "text-field", "tokenizer", "chat-template", "split", "sample",
  "fsdp-sharding-strategy", "lora-modules-to-save", "precompute-ref-log-probs",
  "generation-batch-size", "steps-per-generation", "vllm-mode", "vllm-gpu-memory-utilization", "vllm-enable-sleep-mode",
  "vllm-tensor-parallel-size"]);
const LABELS = {"model": "model", "per-device-train-batch-size": "micro-batch", "max-seq-length": "sequence length",
  "gradient-accumulation-steps": "accumulation steps", "attn-implementation": "attention kernel", "optim": "optimizer",
  "zero": "ZeRO stage", "fsdp": "FSDP", "num-gpus": "GPUs per node", "num-nodes": "nodes", "gpu": "GPU",
  "num-examples": "examples", "tokens-per-example": "tokens per example", "provider": "provider",
  "dtype": "load dtype", "bf16": "bf16 (TrainingArguments)", "fp16": "fp16 (TrainingArguments)"};
const HELP = {"model": "A catalog name, a Hub id (ORG/NAME, read from the local Hugging Face cache), or drop a config.json."};
// A flag whose default is the library's own (the scenario field is None): a third, "unset" state.
const UNSET = {"overlap-comm": "DeepSpeed default"};
const SLIDERS = {"per-device-train-batch-size": {min: 1, max: 64, log2: false},
  "max-seq-length": {min: 7, max: 17, log2: true}};

let FIELDS = [];            // /api/options fields
let GPUS = {};              // id -> GPU row
let extra = [];             // query pairs that are not form fields (kept, so the server can judge them)
// This page instance, for the server: its newer view stops the later work of its older ones (api.py view_check).
const PAGE_ID = Array.from(crypto.getRandomValues(new Uint8Array(8)), (b) => b.toString(16).padStart(2, "0")).join("");
let timer = null, laterTimer = null, inflight = null, lastQuery = null, lastView = null, lastLargest = null;
let lastPrices = null;      // /api/prices of the view shown (kept for a re-render in another unit)

const $ = (id) => document.getElementById(id);
const form = () => $("form");

// ------------------------------------------------------------------ the form

function defaultText(f) {
  if (f.default === null || f.default === undefined) return "";
  return String(f.default);
}

function widget(f) {
  const title = `--${f.name}: ${HELP[f.name] || f.help || ""}`;
  if (f.type === "boolean" && f.default === null) {  // three states: unset (the library's default), on, off
    return el("select", {name: f.name, id: "f-" + f.name, title, "data-tristate": "true"},
      el("option", {value: "", text: UNSET[f.name] || "default"}), el("option", {value: "true", text: "on"}),
      el("option", {value: "false", text: "off"}));
  }
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

function writeField(name, value) {
  const e = form().elements[name];
  if (!e) return;
  const v = value === true || value === false ? String(value) : String(value ?? "");
  if (e.type === "checkbox") e.checked = ["true", "1", "yes", "on"].includes(v.toLowerCase());
  else if (e.dataset.tristate) e.value = ["true", "1", "yes", "on"].includes(v.toLowerCase()) ? "true"
    : ["false", "0", "no", "off"].includes(v.toLowerCase()) ? "false" : "";
  else e.value = v;
  if (e.tagName === "SELECT" && e.value !== v && !e.dataset.tristate) {  // a value the rulesets do not list: the server will say why
    e.append(el("option", {value: v, text: v}));
    e.value = v;
  }
}

function writeForm(params) {
  const known = new Set(FIELDS.map((f) => f.name));
  for (const f of FIELDS) writeField(f.name, params.has(f.name) ? params.get(f.name) : defaultText(f));
  extra = [...params].filter(([k]) => !known.has(k));
  for (const d of $("fields").querySelectorAll("details")) {  // a link that sets a less used flag shows it
    if ([...d.querySelectorAll("[name]")].some((e) => params.has(e.name))) d.open = true;
  }
  syncSliders();
}

// The query of the form: only what differs from the CLI's defaults (an unset three-state flag is left out).
function readForm() {
  const q = new URLSearchParams();
  for (const f of FIELDS) {
    const e = form().elements[f.name];
    if (!e) continue;  // a section the page does not show: its fields keep the CLI's defaults
    const v = e.type === "checkbox" ? String(e.checked) : e.value.trim();
    if (v !== "" && v !== defaultText(f)) q.append(f.name, v);
  }
  for (const [k, v] of extra) q.append(k, v);
  return q.toString();
}

function setField(name, value) {
  writeField(name, value);
  syncSliders();
  changed();
}

// An input changed: what is shown becomes stale at once (dimmed, marked busy), the estimate follows.
function changed(delay = DEBOUNCE_MS) {
  syncSliders();
  const qs = readForm();
  history.replaceState(null, "", addressOf(qs));  // the scenario, then the pinned one (compare.js)
  $("fs-lora")?.classList.toggle("inactive", form().elements["method"].value === "full");
  markStale(true);
  clearTimeout(timer);
  clearTimeout(laterTimer);
  cancelCheapest();
  timer = setTimeout(() => load(qs), delay);
}

function markStale(on) {
  for (const id of ["results", "largest", "gpus", "answer", "cheapest"]) $(id).classList.toggle("stale", on);
  $("results").setAttribute("aria-busy", on ? "true" : "false");
  if (on) { $("largest").dataset.state = "pending"; $("gpus").dataset.priced = "pending"; $("cheapest").dataset.state = "pending"; }
}

// ------------------------------------------------------------------ fetching

async function getJSON(url, signal) {
  const r = await fetch(url, {signal, headers: {Accept: "application/json"}});
  const data = await r.json();
  if (!r.ok) { const e = new Error(data.error || r.statusText); e.download = data.download; e.status = r.status; throw e; }
  return data;
}

async function load(qs) {
  clearTimeout(laterTimer);
  if (inflight) inflight.abort();
  inflight = new AbortController();
  document.body.dataset.state = "loading";
  try {
    const signal = inflight.signal;
    // The verdict first: without the advice's variant scenarios and the scenario on every GPU, which /api/advice
    // and /api/gpus answer right after it.
    const data = await getJSON(`/api/view?${qs}&page=${PAGE_ID}&advice=later&gpus=later`, signal);
    lastQuery = qs;
    lastView = data;
    lastLargest = lastPrices = null;
    render(data);
    showError(null);
    $("results").classList.remove("stale");
    $("answer").classList.remove("stale");
    $("results").setAttribute("aria-busy", "false");
    document.body.dataset.query = qs;
    document.body.dataset.state = "ready";
    // The later requests carry this page's id and the view's number: the server stops their work once this
    // page asks for a newer view (its next change; aborting a request does not stop the server's work).
    const view = `page=${PAGE_ID}&view=${data.view}`;
    loadGpus(qs, signal, view, data).then(() => loadAdvice(qs, signal, view, data));
    laterTimer = setTimeout(() => {
      scheduleCheapest({...data.cheapest, view}, signal,
        Promise.allSettled([loadLargest(qs, signal, view), loadPrices(qs, signal, view)]));
    }, LATER_DELAY_MS);
  } catch (e) {
    if (e.name === "AbortError") return;
    showError(e.message, e.download);
    document.body.dataset.state = "error";
  }
}

// The estimate's advice (/api/estimate's "advice", which the view left out): the list, and the headline of a run
// that does not fit, which may name the first advice.
async function loadAdvice(qs, signal, view, data) {
  const box = $("advice");
  try {
    const got = await getJSON(`/api/advice?${qs}&${view}`, signal);
    if (lastView !== data) return;  // a newer view is shown
    data.estimate.advice = got.advice;
    renderAdvice(data.estimate);
    renderAnswer(data, lastLargest);
  } catch (e) {
    if (e.name === "AbortError" || e.status === 409 || lastView !== data) return;
    box.replaceChildren(el("li", {class: "error", text: e.message}));
    box.dataset.state = "error";
  }
}

// The GPU cards (the scenario on every GPU: /api/view's "gpus", which the view left out), priced once /api/prices
// has answered.
async function loadGpus(qs, signal, view, data) {
  try {
    const got = await getJSON(`/api/gpus?${qs}&${view}`, signal);
    if (lastView !== data) return;  // a newer view is shown
    data.gpus = got;
    renderGpus(data, lastPrices);
  } catch (e) {
    if (e.name === "AbortError" || e.status === 409 || lastView !== data) return;
    $("gpus").replaceChildren(el("p", {class: "error", text: e.message}));
    $("gpus").dataset.cards = "error";
  }
}

async function loadLargest(qs, signal, view) {
  const box = $("largest");
  box.dataset.state = "loading";
  try {
    const data = await getJSON(`/api/largest?${qs}&${view}`, signal);
    lastLargest = data;
    renderLargest(data);
    if (lastView) renderAnswer(lastView, data);
    box.dataset.state = "ready";
    box.dataset.query = qs;
  } catch (e) {
    if (e.name === "AbortError") return;
    box.replaceChildren(el("p", {class: "error", text: e.message}));
    box.dataset.state = "error";
  }
  box.classList.remove("stale");
}

async function loadPrices(qs, signal, view) {
  const box = $("gpus");
  try {
    const prices = await getJSON(`/api/prices?${qs}&${view}`, signal);
    lastPrices = prices;
    if (lastView) renderGpus(lastView, prices);
    box.dataset.query = qs;
  } catch (e) {
    if (e.name === "AbortError") return;
    box.dataset.priced = "error";
  }
  box.classList.remove("stale");
}

// An error: the message (and, for a Hub id that is not cached, a download button); nothing derived from the
// previous scenario stays readable (the header is cleared, the results are dimmed and hidden from assistive
// technology).
function showError(text, download = null) {
  $("error").hidden = !text;
  $("error-text").textContent = text || "";
  const button = $("hub-download");
  button.hidden = !download;
  button.dataset.model = download || "";
  if (download) button.textContent = `Download ${download}'s config.json from the Hugging Face Hub`;
  if (text) {
    clearAnswer("fix the input: " + text.split("\n")[0]);
    markStale(true);
    $("results").setAttribute("aria-hidden", "true");
    $("results").inert = true;
  } else {
    $("results").removeAttribute("aria-hidden");
    $("results").inert = false;
  }
}

async function downloadFromHub() {
  const model = $("hub-download").dataset.model;
  $("hub-download").disabled = true;
  $("hub-download").textContent = `downloading ${model}…`;
  try {
    const r = await fetch("/api/hub-download", {method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({model})});
    const data = await r.json();
    if (!r.ok) throw new Error(data.error);
    changed();
  } catch (e) {
    showError(e.message);
  } finally {
    $("hub-download").disabled = false;
  }
}

// ------------------------------------------------------------------ the derivation popover

let opener = null;

async function explain(target) {
  const quantity = target.dataset.explain;
  const pop = $("explain-pop"), box = $("explain");
  opener = target;
  $("explain-title").textContent = `How ${target.textContent.trim()} is derived`;
  box.replaceChildren(el("p", {class: "note", text: `deriving ${quantity}…`}));
  pop.hidden = false;
  place(pop, target);
  $("explain-close").focus({preventScroll: true});
  try {
    const q = `quantity=${encodeURIComponent(quantity)}${lastQuery ? "&" + lastQuery : ""}`;
    const x = await getJSON("/api/explain?" + q);
    box.replaceChildren(el("ul", {class: "tree", "data-quantity": quantity}, treeNode(x.tree)),
      ...x.seed_differences.map((s) => el("p", {class: "note", text: "seed chapter: " + s})));
    place(pop, target);
  } catch (e) {
    box.replaceChildren(el("p", {class: "error", text: e.message}));
  }
}

// Beside the number on a wide screen (below it, or above when there is no room); a sheet at the bottom of a
// narrow one (CSS). The page does not scroll.
function place(pop, target) {
  if (window.innerWidth < 700) { pop.style.left = pop.style.top = pop.style.width = pop.style.maxHeight = ""; return; }
  const r = target.getBoundingClientRect(), w = Math.min(640, window.innerWidth - 24);
  pop.style.width = w + "px";
  pop.style.left = Math.max(12, Math.min(r.left, window.innerWidth - w - 12)) + "px";
  const above = r.top - 14, below = window.innerHeight - r.bottom - 14;  // the larger side, never over the number
  const room = Math.max(above, below, 160);
  pop.style.maxHeight = room + "px";
  const h = Math.min(pop.scrollHeight, room);
  pop.style.top = (below >= above ? r.bottom + 6 : Math.max(8, r.top - 6 - h)) + "px";
}

function closeExplain() {
  $("explain-pop").hidden = true;
  if (opener && document.contains(opener)) opener.focus({preventScroll: true});
  opener = null;
}

function wireDerivations() {
  document.addEventListener("click", (e) => {
    const t = e.target.closest("[data-explain]");
    if (t && t.dataset.explain && !t.closest("#explain-pop")) explain(t.closest(".num") || t);
    else if (!e.target.closest("#explain-pop") && !$("explain-pop").hidden) closeExplain();
  });
  document.addEventListener("keydown", (e) => {
    const t = e.target.closest && e.target.closest(".num[data-explain]");
    if (t && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); explain(t); }
    if (e.key === "Escape" && !$("explain-pop").hidden) closeExplain();
  });
  $("explain-close").addEventListener("click", closeExplain);
}

// ------------------------------------------------------------------ uploads, links, units

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

function rerender() {
  if (!lastView || document.body.dataset.state === "error") return;
  render(lastView);
  renderAnswer(lastView, lastLargest);
  if (lastLargest) renderLargest(lastLargest);
  if (lastPrices) renderGpus(lastView, lastPrices);
}

// The form's GPU choices name each GPU's usable memory in the chosen unit.
function relabelGpus() {
  for (const o of form().elements["gpu"]?.options || []) {
    const g = GPUS[o.value];
    if (g) o.textContent = `${g.name} (${gb(g.usable_bytes)})`;
  }
}

function wireControls() {
  $("copy-link").addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(location.href);
      $("copy-link").textContent = "Link copied";
    } catch (e) {
      window.prompt("Copy this link:", location.href);
    }
    setTimeout(() => { $("copy-link").textContent = "Copy link"; }, 1500);
  });
  $("hub-download").addEventListener("click", downloadFromHub);
  try { unit = localStorage.getItem("fitplan-unit") === "GiB" ? "GiB" : "GB"; } catch (e) { /* storage off */ }
  $("unit").value = unit;
  relabelGpus();
  $("unit").addEventListener("change", () => {
    unit = $("unit").value;
    try { localStorage.setItem("fitplan-unit", unit); } catch (e) { /* storage off */ }
    relabelGpus();
    rerender();
  });
  let width = window.innerWidth, resized = null;
  window.addEventListener("resize", () => {
    if (window.innerWidth === width) return;
    width = window.innerWidth;
    clearTimeout(resized);
    resized = setTimeout(() => {
      chartWidth = 0;
      if (lastView && document.body.dataset.state !== "error") renderChart(lastView);
    }, 100);
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
  wireDerivations();
  wireControls();
  wireCompare();
  const params = takePin(new URLSearchParams(location.search));
  writeForm(location.search.length > 1 ? params : new URLSearchParams(EXAMPLE));
  changed();
  loadPinned();
}

main();
