// fitplan serve's page, the "cheapest plan that fits" card. Last of the deferred requests: once the inputs are
// still and the largest values and GPU prices are in, /api/recommend with the query /api/view gives for it
// (`cheapest`: the page's training with the fields a plan chooses left to the search, src/fitplan/web/cheapest.py).
// Plan 1 is shown with its `fitplan estimate` command line and an "apply" button that sets the page's scenario
// to the plan's flags. Every figure is the recommender's (docs/serve.md); this file formats them.
"use strict";

const CHEAPEST_DELAY_MS = 750;  // a search is seconds of server CPU: it waits for a longer stillness than the prices
let cheapestTimer = null, cheapestAbort = null;

// After `before` (the largest values and the prices) settles, and CHEAPEST_DELAY_MS more, unless the scenario
// changed meanwhile (`signal`, the view's: aborted by the next change).
function scheduleCheapest(request, signal, before) {
  clearTimeout(cheapestTimer);
  before.then(() => {
    if (!signal.aborted) cheapestTimer = setTimeout(() => loadCheapest(request, signal), CHEAPEST_DELAY_MS);
  });
}

function cancelCheapest() {
  clearTimeout(cheapestTimer);
  if (cheapestAbort) cheapestAbort.abort();
  const box = $("cheapest");
  box.classList.add("stale");
  box.dataset.state = "pending";
}

async function loadCheapest(request, signal) {
  const box = $("cheapest"), status = $("cheapest-status");
  if (cheapestAbort) cheapestAbort.abort();
  const mine = cheapestAbort = new AbortController();
  const onAbort = () => mine.abort();
  signal.addEventListener("abort", onAbort);
  let timedOut = false;
  const limit = setTimeout(() => { timedOut = true; mine.abort(); }, (request.longest_seconds + 10) * 1000);
  box.dataset.state = "loading";
  status.textContent = `searching plans for this training (effective batch ${request.effective_batch_size})…`;
  try {
    const result = await getJSON("/api/recommend?" + request.query + (request.view ? "&" + request.view : ""),
      mine.signal);  // page and view: the server stops the search once this page asks a newer view (app.js)
    renderCheapest(result, request);
    box.dataset.state = result.plans.length ? "ready" : "none";
    box.dataset.query = request.query;
  } catch (e) {
    if (e.name === "AbortError" && !timedOut) return;
    const why = timedOut ? `no answer after ${request.longest_seconds + 10} s` : e.message;
    status.textContent = "";
    box.replaceChildren(el("p", {class: "error", text: "The search for the cheapest plan failed: " + why}));
    box.dataset.state = "error";
  } finally {
    clearTimeout(limit);
    signal.removeEventListener("abort", onAbort);
  }
  box.classList.remove("stale");
}

function shardingText(p) {
  if (!p.zero_stage) return "none (each GPU holds the whole model)";
  const off = [p.offload_optimizer ? "optimizer" : null, p.offload_params ? "parameters" : null].filter(Boolean);
  return `DeepSpeed ZeRO-${p.zero_stage}` + (off.length ? `, ${off.join(" and ")} offloaded to the CPU` : "");
}

function gpusText(p) {
  const name = GPUS[p.gpu] ? GPUS[p.gpu].name : p.gpu;
  return p.num_nodes > 1 ? `${p.num_nodes} nodes × ${p.num_gpus} × ${name}` : `${p.num_gpus} × ${name}`;
}

function instanceText(c) {
  if (!c || !c.provider) return "–";
  const idle = c.gpus_idle ? ` (${c.gpus_paid} GPUs paid, ${c.gpus_idle} idle)` : "";
  return `${c.provider} · ${c.instance_count} × ${c.instance}${c.region ? " (" + c.region + ")" : ""}${idle}`;
}

function range(pair, fmt) {
  return pair && pair.length === 2 && pair[0] !== null ? ` (likely ${fmt(pair[0])} – ${fmt(pair[1])})` : "";
}

function renderCheapest(result, request) {
  const box = $("cheapest"), status = $("cheapest-status");
  status.textContent = request.dataset_size ? "" : "No dataset size: the recommender needs one for time and cost, so " +
    "this is the plan with the fewest GPUs. Give the examples and tokens per example (Dataset) for the cheapest.";
  const plan = result.plans[0];
  if (!plan) { box.replaceChildren(...noPlan(result, request)); return; }
  const p = plan.plan, c = plan.cost || {};
  const row = (key, label, text) => el("tr", {"data-field": key}, el("th", {scope: "row", text: label}), el("td", {text}));
  const apply = el("button", {type: "button", id: "cheapest-apply", title: "set the page's scenario to this plan's flags",
    text: "apply"});
  apply.addEventListener("click", () => applyPlan(plan, request));
  box.replaceChildren(
    el("p", {class: "plan-label"}, el("b", {text: plan.label}), " ", apply),
    el("table", {class: "plan", "data-plan": JSON.stringify(p)},
      row("gpus", "GPUs", gpusText(p)),
      row("provider", "provider · instance", instanceText(c)),
      row("sharding", "sharding", shardingText(p)),
      row("batch", "micro-batch × accumulation",
        `${p.per_device_train_batch_size} × ${p.gradient_accumulation_steps} (effective batch ${request.effective_batch_size})`),
      row("checkpointing", "gradient checkpointing", p.gradient_checkpointing ? "on" : "off"),
      row("attention", "attention kernel", p.attn_implementation),
      row("time", "time", hours(plan.train_seconds) + range(plan.likely_train_seconds, hours)),
      row("cost", `cost (${plan.market === "spot" ? "spot" : "on demand"})`,
        money(plan.cost_usd, c.currency) + range(plan.likely_cost_usd, (v) => money(v, c.currency)))),
    el("pre", {class: "command"}, el("code", {id: "cheapest-command", text: plan.command})),
    ...plan.warnings.map((w) => el("p", {class: "note", text: "warning: " + w})));
}

// No plan fits: what was searched, and why the candidates were dropped.
function noPlan(result, request) {
  const s = result.search || {};
  const dropped = [s.too_big ? `${s.too_big} too big for their GPU` : null,
    s.too_big_host_ram ? `${s.too_big_host_ram} beyond the instance's host memory` : null,
    s.rejected ? `${s.rejected} refused by a policy` : null, s.unpriced ? `${s.unpriced} without a price` : null,
    s.invalid ? `${s.invalid} invalid` : null].filter(Boolean);
  return [el("p", {class: "nofit-reason", id: "cheapest-none", text: `No plan fits this training (effective batch ` +
      `${request.effective_batch_size}): ` +
      `${s.candidates ?? 0} candidate plans searched${dropped.length ? ", " + dropped.join(", ") : ""}.`}),
    el("p", {class: "note", text: "Try LoRA or QLoRA or a shorter sequence; see below what the search left out."}),
    s.notes && s.notes.length ? el("details", {class: "note"}, el("summary", {text: "what the search left out"}),
      ...s.notes.map((n) => el("p", {text: n}))) : null].filter(Boolean);
}

// The page's scenario becomes the plan's: the fields a plan chooses are reset to their defaults, then set to
// the plan's values (the plan's command line is the page's scenario with those fields), and everything follows.
function applyPlan(plan, request) {
  const byField = Object.fromEntries(FIELDS.map((f) => [f.field, f]));
  for (const f of FIELDS) if (request.searched.includes(f.name)) writeField(f.name, defaultText(f));
  for (const [field, value] of Object.entries(plan.plan)) if (byField[field]) writeField(byField[field].name, value);
  changed();
}
