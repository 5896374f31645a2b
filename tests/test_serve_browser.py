"""``fitplan serve``'s page in a real browser: Debian's Chromium, driven by playwright (pointed at that binary;
playwright's own browser download is not used). Skipped without Chromium, except under ``.ci/run``
(``FITPLAN_REQUIRE_BROWSER=1``), where a missing browser fails.

The page is loaded, the micro-batch changed across the fits boundary (the chart and the verdict must follow;
each change is timed in the page and printed, but not asserted: timings belong in bench/bench_serve.py, which
measures the input-to-verdict time in Chromium), a shared link must
reproduce the view, an export is downloaded and read back by the CLI, a number's derivation is opened, a
config.json is uploaded, and a screenshot is kept (under pytest's tmp dir; also in ``$FITPLAN_ARTIFACTS`` when
set). Then the answer line (against the CLI, the cheapest provider found by running it once per provider), a run
that does not fit (no download), an error clearing the verdict, panels dimmed at the input event, a three-state
flag in the link, a phone screen (no sideways scroll, 12 px chart text, results first) and the keyboard opening a
derivation. The expected numbers are the CLI's (``fitplan estimate --format json`` for the same flags). About 60 s.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.parse

import pytest
from click.testing import CliRunner

from conftest import ROOT, chromium_path, require_modules
from test_serve import cli_output, flags

START = {"model": "llama-2-7b", "gpu": "a100-80gb", "precision": "bf16-true", "gradient-checkpointing": "true",
         "num-examples": "10000", "tokens-per-example": "512"}


@pytest.fixture(scope="module")
def browser():
    require_modules("starlette", "uvicorn", "playwright")
    path = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.fixture
def page(browser, served):
    context = browser.new_context(viewport={"width": 1400, "height": 1100}, accept_downloads=True)
    pg = context.new_page()
    pg.problems = []
    pg.on("pageerror", lambda e: pg.problems.append(f"page error: {e}"))
    pg.on("console", lambda m: pg.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    pg.on("request", lambda r: None if r.url.startswith(served.url) else pg.problems.append(f"request to {r.url}"))
    yield pg
    context.close()


def open_view(page, served, query: dict[str, str]) -> None:
    page.goto(served.url + "?" + urllib.parse.urlencode(query))
    page.wait_for_selector("body[data-state=ready]", timeout=20_000)
    page.wait_for_selector("#gpus[data-cards=ready]", timeout=20_000)  # right after the verdict (/api/gpus)


def cli_json(query: dict[str, str]) -> dict:
    return json.loads(cli_output("estimate", *flags(query), "--format", "json"))


def shown(page) -> dict:
    """What the page shows: the verdict, the numbers it renders (their exact bytes are in data attributes), the
    chart's bars, and the form's values."""
    return page.evaluate("""() => ({
        fits: document.getElementById('verdict').dataset.fits,
        verdict: document.getElementById('verdict').textContent,
        peak: Number(document.getElementById('peak').dataset.bytes),
        device_total: Number(document.getElementById('device-total').dataset.bytes),
        usable: Number(document.getElementById('usable')?.dataset.bytes),
        bars: [...document.querySelectorAll('#chart rect')].map(r => [r.dataset.key, Number(r.dataset.bytes)]),
        form: Object.fromEntries([...document.querySelectorAll('#fields [name]')].map(e =>
            [e.name, e.type === 'checkbox' ? e.checked : e.value])),
        query: document.body.dataset.query,
    })""")


def change_micro_batch(page, value: int) -> float:
    """Type ``value`` into the micro-batch field as a user would (an input event) and return the milliseconds until
    the verdict and the chart show the estimate of the new value (measured in the page, as bench/bench_serve.py
    does: :mod:`fitplan.web.page_timing`)."""
    from fitplan.web.page_timing import input_to_verdict_ms

    return input_to_verdict_ms(page, "per-device-train-batch-size", value, timeout_ms=10_000)


def test_the_page_shows_the_cli_numbers_and_follows_the_micro_batch(page, served, tmp_path):
    largest = json.loads(cli_output("recommend", *flags(START), "--max", "micro-batch", "--headroom", "0",
                                    "--format", "json"))["largest"]
    assert largest >= 2
    open_view(page, served, {**START, "per-device-train-batch-size": str(largest)})
    before = shown(page)
    cli = cli_json({**START, "per-device-train-batch-size": str(largest)})["memory"]
    assert (before["peak"], before["device_total"], before["usable"]) == (
        cli["per_gpu_bytes"]["peak"], cli["per_gpu_bytes"]["device_total"], cli["usable_bytes"])
    assert before["fits"] == "true" and "fits" in before["verdict"]
    cards = page.eval_on_selector_all("#gpus .gpu", "bs => bs.map(b => [b.dataset.gpu, b.dataset.fits])")
    assert len(cards) == len(served.settings.context().rulesets.gpus) and ["a100-80gb", "true"] in cards
    assert page.eval_on_selector("#gpus .gpu.selected", "b => b.dataset.gpu") == "a100-80gb"
    assert len(page.query_selector_all("#providers tr.provider")) >= 2  # priced by several providers

    times = [change_micro_batch(page, largest + 1)]
    after = shown(page)
    cli = cli_json({**START, "per-device-train-batch-size": str(largest + 1)})["memory"]
    assert after["fits"] == "false" and "does not fit" in after["verdict"]
    assert after["device_total"] == cli["per_gpu_bytes"]["device_total"] > before["device_total"]
    assert dict(after["bars"])["phase:" + cli["peak_phase"]] == cli["phases_bytes"][cli["peak_phase"]]
    assert after["bars"] != before["bars"]
    times.append(change_micro_batch(page, largest))
    assert shown(page)["fits"] == "true"
    times += [change_micro_batch(page, b) for b in (largest - 1, largest + 2, 2)]  # 1 is the default: not in the link
    (tmp_path / "slider-ms.json").write_text(json.dumps(times))
    print(f"micro-batch change on the page: {', '.join(f'{t:.0f}' for t in times)} ms")  # bench/bench_serve.py: goals
    page.wait_for_selector("#largest[data-state=ready]")
    assert page.get_attribute("#largest-micro-batch .num", "data-value") == str(largest)  # back at 2: same answer
    assert page.problems == []
    save_screenshot(page, tmp_path)


def save_screenshot(page, tmp_path) -> None:
    png = tmp_path / "fitplan-serve.png"
    page.screenshot(path=str(png), full_page=True)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 50_000
    if os.environ.get("FITPLAN_ARTIFACTS"):
        os.makedirs(os.environ["FITPLAN_ARTIFACTS"], exist_ok=True)
        shutil.copy(png, os.path.join(os.environ["FITPLAN_ARTIFACTS"], png.name))


def test_a_shared_link_reproduces_the_view(page, browser, served):
    open_view(page, served, START)
    page.select_option("#f-method", "lora")
    page.fill("#f-lora-r", "32")
    page.select_option("#f-gpu", "h100-sxm")
    page.wait_for_function("() => document.body.dataset.query.includes('gpu=h100-sxm') && "
                           "document.body.dataset.query.includes('lora-r=32') && document.body.dataset.state === 'ready'")
    here = shown(page)
    link = page.url
    other = browser.new_page()
    try:
        other.goto(link)
        other.wait_for_selector("body[data-state=ready]", timeout=20_000)
        there = shown(other)
    finally:
        other.close()
    assert there == here
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(link).query))
    cli = cli_json(query)["memory"]
    assert there["device_total"] == cli["per_gpu_bytes"]["device_total"] and there["fits"] == str(cli["fits"]).lower()


def test_an_export_downloads_and_reads_back(page, served, tmp_path):
    open_view(page, served, START)
    with page.expect_download() as info:
        page.click("a[data-export=scenario]")
    path = tmp_path / info.value.suggested_filename
    info.value.save_as(path)
    assert path.name == "fitplan-plan.toml"
    back = json.loads(cli_output("estimate", str(path), "--format", "json"))
    assert back["memory"]["per_gpu_bytes"]["peak"] == shown(page)["peak"]
    assert page.query_selector("span.button.disabled") is not None  # no DeepSpeed here: ds_config.json is offered greyed


def test_a_number_opens_its_derivation(page, served):
    open_view(page, served, START)
    page.click("#peak")
    page.wait_for_selector("#explain .tree")
    tree = json.loads(cli_output("explain", "peak", *flags(START), "--format", "json"))["tree"]
    assert page.inner_text("#explain .tree b >> nth=0") == tree["name"]
    assert tree["value"] in page.inner_text("#explain .tree")


def test_a_dropped_config_is_estimated(page, served):
    open_view(page, served, START)
    page.set_input_files("#file", str(ROOT / "tests/data/configs/tiny-llama/config.json"))
    page.wait_for_function("() => (document.body.dataset.query || '').includes('model=upload%3A') && "
                           "document.body.dataset.state === 'ready'")
    assert "llama" in page.inner_text("#summary") and page.input_value("#f-model").startswith("upload:")
    assert page.problems == []


def test_a_confidence_band_is_read_in_each_documented_shape(page, served):
    """The time model's band (#14) is shown when the report carries one, in any shape docs/serve.md lists; the
    value alone otherwise."""
    open_view(page, served, START)
    got = page.evaluate("""() => [
        band({seconds: 5, seconds_band: [4, 7]}, 'seconds'),
        band({seconds: 5, seconds_range: {low: 4, high: 7}}, 'seconds'),
        band({seconds: 5, seconds_interval: {lo: 4, hi: 7}}, 'seconds'),
        band({seconds: 5, seconds_low: 4, seconds_high: 7}, 'seconds'),
        band({seconds: 5, band: [4, 5, 7]}, 'seconds'),
        band({seconds: 5}, 'seconds'),
        withBand('5 s', band({seconds_band: [4, 7]}, 'seconds'), String),
        withBand('5 s', null, String)]""")
    assert got[:5] == [[4, 7]] * 5 and got[5] is None
    assert got[6:] == ["5 s (band 4 – 7)", "5 s"]


# --------------------------------------------------------------------------- the answer first, states, small screens


def page_query(page) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(page.evaluate("document.body.dataset.query")))


def cheapest_on_the_cli(query: dict[str, str]) -> tuple[str, float]:
    """The provider whose on-demand cost is lowest for ``query``, by running ``fitplan estimate --provider P`` for
    every provider of the rulesets (those that rent no such GPU fail and are skipped)."""
    from fitplan.cli import cli, load_commands
    from fitplan.context import get_context

    load_commands()
    costs = {}
    for pid in get_context(()).rulesets.providers:
        result = CliRunner().invoke(cli, ["estimate", *flags({**query, "provider": pid}), "--format", "json"])
        if result.exit_code == 0:
            cost = json.loads(result.stdout)["cost"]["on_demand_usd"]
            if cost is not None:
                costs[pid] = cost
    best = min(costs, key=costs.get)
    return best, costs[best]


def test_the_answer_comes_first_for_the_default_scenario(page, served):
    """The page's own example (no query: full fine-tuning of a 7B model in bf16-mixed on one A100 80GB, which
    does not fit): one line says so, with the memory against the usable memory and, since even micro-batch 1
    does not fit, the first advice's flags; the form has the load dtype as a select and bf16/fp16 as boxes.
    The cheapest plan that fits is on the page too: ``fitplan recommend`` for the example's training with the
    plan's fields left free (model, precision, the documented default optimizer, the dataset; effective batch by
    hand: micro-batch 4 × accumulation 1 × 1 GPU = 4), ranked by cost: the card shows its plan 1."""
    page.goto(served.url)
    page.wait_for_selector("body[data-state=ready]", timeout=20_000)
    page.wait_for_selector("#largest[data-state=ready]", timeout=30_000)
    page.wait_for_selector("#advice[data-state=ready]", timeout=30_000)  # after the verdict (/api/advice)
    query = page_query(page)
    assert query == {"model": "llama-2-7b", "gpu": "a100-80gb", "precision": "bf16-mixed",
                     "per-device-train-batch-size": "4", "gradient-checkpointing": "true", "num-examples": "10000",
                     "tokens-per-example": "512"}  # the README's example, as docs/serve.md says
    cli = cli_json(query)
    per, usable = cli["memory"]["per_gpu_bytes"], cli["memory"]["usable_bytes"]
    assert cli["memory"]["fits"] is False and page.get_attribute("#verdict", "data-fits") == "false"
    largest = json.loads(cli_output("recommend", *flags(query), "--max", "micro-batch", "--headroom", "0",
                                    "--format", "json"))["largest"]
    assert not largest  # even 1 does not fit: the headline names the advice instead
    advice = cli["advice"][0]["variant"]
    (field, value), = advice.items()
    assert page.inner_text("#headline") == (f"does not fit · {per['device_total'] / 1e9:.1f} of {usable / 1e9:.1f} GB"
                                            f" · try --{field.replace('_', '-')} {value} (see Advice)")
    assert page.eval_on_selector_all("#advice li[data-advice]", "ls => ls.map(l => l.dataset.advice)") == [
        a["id"] for a in cli["advice"]]  # the advice, asked for after the verdict, is the CLI's
    assert page.get_attribute("#answer", "aria-live") == "polite" and page.get_attribute("#answer", "role") == "status"
    assert page.eval_on_selector("#f-dtype", "e => [e.tagName, [...e.options].map(o => o.value)]") == [
        "SELECT", ["auto", "float32", "bfloat16", "float16"]]
    assert page.eval_on_selector_all("#f-bf16, #f-fp16", "es => es.map(e => e.type)") == ["checkbox", "checkbox"]
    page.wait_for_selector("#cheapest[data-state=ready]", timeout=90_000)
    plan = json.loads(cli_output("recommend", "--model", "llama-2-7b", "--precision", "bf16-mixed", "--optim",
                                 "adamw_torch_fused", "--num-examples", "10000", "--tokens-per-example", "512",
                                 "--effective-batch-size", "4", "--objective", "cost", "--top", "1",
                                 "--format", "json"))["plans"][0]
    assert json.loads(page.get_attribute("#cheapest table.plan", "data-plan")) == plan["plan"]
    assert page.inner_text("#cheapest-command") == plan["command"]
    assert page.inner_text("#cheapest [data-field=cost] td").startswith(f"${plan['cost_usd']:,.2f}")
    assert page.problems == []


def test_the_answer_of_a_run_that_fits_names_the_cheapest_provider(page, served):
    """fits · memory · time · the cheapest provider (found by running the CLI once per provider); the GPU cards
    sorted fits first, then by cost, the chosen GPU's card priced by the same cheapest provider."""
    query = {**START, "optim": "adamw_torch"}
    open_view(page, served, query)
    cli = cli_json(query)
    best, cost = cheapest_on_the_cli(query)
    headline = page.inner_text("#headline")
    per, usable, seconds = cli["memory"]["per_gpu_bytes"], cli["memory"]["usable_bytes"], cli["time"]["seconds"]
    assert cli["memory"]["fits"] is True and page.get_attribute("#verdict", "data-fits") == "true"
    hours = f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"
    assert headline == (f"fits · {per['device_total'] / 1e9:.1f} of {usable / 1e9:.1f} GB · {hours} · "
                        f"${cost:,.2f} on {best}, cheapest"), (headline, best, cost)
    page.wait_for_selector("#gpus[data-priced=true]", timeout=30_000)
    cards = page.eval_on_selector_all("#gpus .gpu", """bs => bs.map(b => [b.dataset.gpu, b.dataset.fits,
        b.querySelector('.price').textContent])""")
    fits = [f for _, f, _ in cards]
    assert fits == sorted(fits, key=lambda f: f != "true")  # fitting GPUs first
    prices = [float(p.split(" ")[0].lstrip("$").replace(",", "")) for _, f, p in cards if f == "true" and p.startswith("$")]
    assert prices == sorted(prices) and len(prices) >= 3
    chosen = next(p for g, _, p in cards if g == query["gpu"])
    assert chosen.startswith(f"${cost:,.2f} · ") and chosen.endswith(f" · {best}")
    assert page.problems == []


def test_a_run_that_does_not_fit_says_what_to_change_and_offers_no_download(page, served):
    largest = json.loads(cli_output("recommend", *flags({**START, "optim": "adamw_torch"}), "--max", "micro-batch",
                                    "--headroom", "0", "--format", "json"))["largest"]
    query = {**START, "optim": "adamw_torch", "per-device-train-batch-size": str(largest + 1)}
    open_view(page, served, query)
    assert cli_json(query)["memory"]["fits"] is False
    assert page.get_attribute("#verdict", "data-fits") == "false"
    page.wait_for_selector("#largest[data-state=ready]", timeout=30_000)
    headline = page.inner_text("#headline")
    assert headline.startswith("does not fit · ") and headline.endswith(f"largest micro-batch that fits: {largest}")
    assert page.query_selector_all("#exports a[data-export]") == []
    disabled = page.eval_on_selector_all("#exports span.button.disabled", "es => es.map(e => e.getAttribute('title'))")
    from fitplan.output.exports import FILENAMES  # every export the page offers: each one disabled, with the reason

    assert len(disabled) == len(FILENAMES) and all("does not fit" in t for t in disabled)
    assert "nofit" in page.get_attribute("#providers", "class") and "does not fit" in page.inner_text("#nofit-cost")


def test_an_error_clears_the_old_verdict(page, served):
    open_view(page, served, START)
    assert page.get_attribute("#verdict", "data-fits") == "true"
    page.fill("#f-model", "llama-2-13")
    page.wait_for_selector("body[data-state=error]", timeout=20_000)
    assert "fits" not in page.inner_text("#verdict") and page.get_attribute("#verdict", "data-fits") == ""
    assert page.inner_text("#headline").startswith("fix the input: ") and page.inner_text("#summary") == ""
    assert "llama-2-13" in page.inner_text("#error")
    assert page.get_attribute("#results", "aria-hidden") == "true" and "stale" in page.get_attribute("#results", "class")


def test_stale_panels_dim_as_soon_as_an_input_changes(page, served):
    open_view(page, served, START)
    page.wait_for_selector("#largest[data-state=ready]", timeout=30_000)
    dimmed = page.evaluate("""() => {
        const input = document.getElementById('f-per-device-train-batch-size');
        input.value = '3';
        input.dispatchEvent(new Event('input', {bubbles: true}));
        return ['results', 'largest', 'gpus', 'answer', 'cheapest'].map(id => document.getElementById(id).classList.contains('stale'));
    }""")  # synchronously, before any reply
    assert dimmed == [True, True, True, True, True]
    page.wait_for_function("() => document.body.dataset.state === 'ready' && document.body.dataset.query.includes('batch-size=3')")
    page.wait_for_selector("#largest[data-state=ready]", timeout=30_000)
    assert page.evaluate("['results', 'largest', 'answer'].map(id => document.getElementById(id).classList.contains('stale'))") == [
        False, False, False]


def test_an_unset_flag_stays_out_of_the_link(page, served):
    """overlap_comm has DeepSpeed's default unless it is set: the link and the downloads carry no overlap-comm
    until the user picks on or off, and a link reproduces each of the three states."""
    query = {**START, "optim": "adamw_torch", "precision": "bf16-master", "zero": "2", "num-gpus": "8"}
    open_view(page, served, query)
    assert page.get_attribute("#verdict", "data-fits") == "true"  # so that the downloads are offered
    assert "overlap-comm" not in page.url and page.input_value("#f-overlap-comm") == ""
    assert "overlap-comm" not in page.get_attribute("a[data-export=deepspeed]", "href")
    page.click("#fs-parallel details > summary")  # a less used flag: under "more"
    for value in ("false", "true", ""):
        page.select_option("#f-overlap-comm", value)
        want = f"overlap-comm={value}" if value else None
        page.wait_for_function("(want) => document.body.dataset.state === 'ready' && "
                               "(want ? document.body.dataset.query.includes(want) : !document.body.dataset.query.includes('overlap-comm'))",
                               arg=want)
        link = page.url
        assert (want in link) if want else ("overlap-comm" not in link)
        page.goto(link)
        page.wait_for_selector("body[data-state=ready]", timeout=20_000)
        assert page.input_value("#f-overlap-comm") == value and page.url == link
        if value:
            assert page.is_visible("#f-overlap-comm")  # the link's flag is shown (its "more" opened)
        else:
            page.click("#fs-parallel details > summary")


def test_a_phone_screen_does_not_scroll_sideways(browser, served):
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    try:
        open_view(page, served, {**START, "provider": "aws"})
        page.wait_for_selector("#largest[data-state=ready]", timeout=30_000)
        got = page.evaluate("""() => {
            const svg = document.querySelector('#chart svg'), scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
            const fonts = [...svg.querySelectorAll('text')].map(t => parseFloat(getComputedStyle(t).fontSize) * scale);
            return {scroll: document.scrollingElement.scrollWidth, width: innerWidth, font: Math.min(...fonts),
                    results: document.getElementById('results').getBoundingClientRect().top,
                    form: document.getElementById('form').getBoundingClientRect().top,
                    header: document.querySelector('header').getBoundingClientRect().height,
                    headerPosition: getComputedStyle(document.querySelector('header')).position};
        }""")
        assert got["scroll"] <= got["width"], got
        assert got["font"] >= 11.5 and got["results"] < got["form"], got
        assert got["headerPosition"] != "sticky" or got["header"] < 120, got
    finally:
        context.close()


def test_the_keyboard_reaches_a_number_and_opens_its_derivation(page, served):
    open_view(page, served, START)
    page.evaluate("document.activeElement.blur()")
    for _ in range(60):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.matches('.num[data-explain]')"):
            break
    else:
        raise AssertionError("Tab never reached a number with a derivation")
    quantity = page.evaluate("document.activeElement.dataset.explain")
    number = page.evaluate("(() => { const r = document.activeElement.getBoundingClientRect(); return [r.left, r.bottom]; })()")
    scrolled = page.evaluate("scrollY")
    page.keyboard.press("Enter")
    page.wait_for_selector("#explain .tree")
    tree = json.loads(cli_output("explain", quantity, *flags(START), "--format", "json"))["tree"]
    assert page.inner_text("#explain .tree b >> nth=0") == tree["name"]
    text = page.inner_text("#explain-pop")
    assert "``" not in text and "{" not in text  # formula lines, not dicts or RST
    pop = page.evaluate("(() => { const r = document.getElementById('explain-pop').getBoundingClientRect(); return [r.left, r.top]; })()")
    assert abs(pop[1] - number[1]) < 40 or pop[1] < number[1]  # opened beside the number (below it, or above)
    assert page.evaluate("scrollY") == scrolled  # the page did not jump
    page.keyboard.press("Escape")
    assert page.is_hidden("#explain-pop") and page.evaluate("document.activeElement.dataset.explain") == quantity
    assert page.problems == []


def test_the_keyboard_reaches_every_derivation(page, served):
    """Every quantity the page offers a derivation of (each ``data-explain`` on the page: table numbers, chart
    bars, the usable-memory mark, the time, the costs) is reached by Tab alone on a number that opens it with
    Enter (its tree, the CLI's ``fitplan explain`` root) and closes with Escape, focus back on the number."""
    open_view(page, served, {**START, "optim": "adamw_torch", "provider": "aws"})
    page.wait_for_selector("#gpus[data-priced=true]", timeout=30_000)
    offered = set(page.eval_on_selector_all("[data-explain]:not(#explain-pop *)",
                                            "es => es.map(e => e.dataset.explain).filter(Boolean)"))
    assert len(offered) >= 6, offered  # the memory rows, peak, device total, usable, time, costs
    page.evaluate("document.activeElement.blur()")
    reached: list[str] = []
    for _ in range(600):
        page.keyboard.press("Tab")
        quantity = page.evaluate("document.activeElement.matches('.num[data-explain]') ? "
                                 "document.activeElement.dataset.explain : null")
        if quantity and quantity not in reached:
            reached.append(quantity)
            page.keyboard.press("Enter")
            page.wait_for_selector(f"#explain .tree[data-quantity='{quantity}']", timeout=30_000)
            page.keyboard.press("Escape")
            assert page.is_hidden("#explain-pop") and page.evaluate("document.activeElement.dataset.explain") == quantity
        if offered <= set(reached):
            break
    assert offered <= set(reached), sorted(offered - set(reached))
    assert page.problems == []


def test_make_screenshots_saves_the_page_at_1400_and_390_px(tmp_path):
    """``make screenshots`` runs bench/serve_screenshots.py, whose shots include the page at 1400 px and at 390 px;
    run (here with those two shots only), it saves PNGs of those widths (each PNG's IHDR), full pages."""
    import re
    import struct
    import subprocess
    import sys

    require_modules("starlette", "uvicorn", "playwright")
    chromium_path()
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^screenshots:.*\n\t.*bench/serve_screenshots\.py \$\(or \$\(DIR\),", make, re.M)
    code = ("import importlib.util, sys\n"
            "spec = importlib.util.spec_from_file_location('shots', sys.argv[1])\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "widths = {w for _, _, w, _ in m.SHOTS}\n"
            "assert {1400, 390} <= widths, widths\n"
            "m.SHOTS = [s for s in m.SHOTS if s[0] in ('fits-1400', 'fits-390')]\n"
            "sys.argv = sys.argv[1:]\n"
            "sys.exit(m.main())\n")
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT / "bench/serve_screenshots.py"), str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name, width in (("fits-1400", 1400), ("fits-390", 390)):
        png = (tmp_path / f"fitplan-serve-{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
        w, h = struct.unpack(">II", png[16:24])
        assert w == width and h >= 900, (name, w, h)  # the full page, at least the 900 px viewport
        assert str(tmp_path / f"fitplan-serve-{name}.png") in proc.stdout


def test_the_cheapest_plan_card_shows_the_recommenders_plan_1_and_applies_it(page, served):
    """The card searches the page's training with the plan's fields left free: ``fitplan recommend`` with the
    scenario's model, precision, optimizer and dataset, and the page's effective batch (by hand: micro-batch 4 ×
    accumulation 2 × 1 GPU = 8), ranked by cost. Its plan 1 (fields, cost, command line) is the CLI's; "apply"
    puts the plan's GPU, provider and batch split into the address, and the page then estimates exactly the plan's
    command line. Without a dataset size the card says so and ranks by GPUs."""
    query = {**START, "precision": "bf16-mixed", "optim": "adamw_torch_fused", "per-device-train-batch-size": "4",
             "gradient-accumulation-steps": "2"}
    open_view(page, served, query)
    page.wait_for_selector("#cheapest[data-state=ready]", timeout=90_000)
    cli = json.loads(cli_output("recommend", "--model", "llama-2-7b", "--precision", "bf16-mixed", "--optim",
                                "adamw_torch_fused", "--num-examples", "10000", "--tokens-per-example", "512",
                                "--effective-batch-size", "8", "--objective", "cost", "--top", "1", "--format", "json"))
    plan = cli["plans"][0]
    assert json.loads(page.get_attribute("#cheapest table.plan", "data-plan")) == plan["plan"]
    assert page.inner_text("#cheapest-command") == plan["command"]
    assert page.inner_text("#cheapest [data-field=cost] td").startswith(f"${plan['cost_usd']:,.2f}")
    p = plan["plan"]
    assert page.inner_text("#cheapest [data-field=batch] td").startswith(
        f"{p['per_device_train_batch_size']} × {p['gradient_accumulation_steps']} (effective batch 8)")
    assert "stale" not in page.get_attribute("#cheapest", "class")
    page.click("#cheapest-apply")
    page.wait_for_function("() => document.body.dataset.state === 'ready' && document.body.dataset.query.includes('provider=')")
    address = dict(urllib.parse.parse_qsl(page.evaluate("location.search.slice(1)")))
    assert (address["gpu"], address["provider"]) == (p["gpu"], p["provider"]), address
    cli_plan = json.loads(cli_output(*plan["command"].split()[1:], "--format", "json"))  # no quoting in this one
    assert shown(page)["device_total"] == cli_plan["memory"]["per_gpu_bytes"]["device_total"]
    page.wait_for_selector("#cheapest[data-state=ready]", timeout=90_000)  # the applied plan is its own plan 1
    assert page.inner_text("#cheapest-command") == plan["command"]
    page.evaluate("""() => {  // both at once: tokens per example alone is an error
        for (const id of ['f-num-examples', 'f-tokens-per-example']) document.getElementById(id).value = '';
        document.getElementById('f-tokens-per-example').dispatchEvent(new Event('input', {bubbles: true}));
    }""")
    page.wait_for_selector("#cheapest[data-state=ready]", timeout=90_000)
    assert "No dataset size" in page.inner_text("#cheapest-status")
    assert page.problems == []


def test_the_cheapest_plan_card_says_when_nothing_fits_or_the_search_fails(page, served):
    """A 70B model in fp32 at 32k tokens with an effective batch of 1 (one GPU, so no sharding): the recommender
    finds no plan (``fitplan recommend`` says so for the same flags), and the card says it; an effective batch past
    the server's bound (1 × 70,000 > 65,536) is the server's message on the card."""
    query = {"model": "llama-2-70b", "gpu": "b200", "precision": "32-true", "optim": "adamw_torch",
             "max-seq-length": "32768", "num-examples": "1000", "tokens-per-example": "512"}
    cli = json.loads(cli_output("recommend", "--model", "llama-2-70b", "--precision", "32-true", "--optim", "adamw_torch",
                                "--max-seq-length", "32768", "--num-examples", "1000", "--tokens-per-example", "512",
                                "--effective-batch-size", "1", "--top", "1", "--format", "json"))
    assert cli["plans"] == []
    open_view(page, served, query)
    page.wait_for_selector("#cheapest[data-state=none]", timeout=90_000)
    assert page.inner_text("#cheapest-none").startswith(
        f"No plan fits this training (effective batch 1): {cli['search']['candidates']} candidate plans searched")
    open_view(page, served, {**START, "optim": "adamw_torch", "method": "qlora", "gradient-accumulation-steps": "70000"})
    page.wait_for_selector("#cheapest[data-state=error]", timeout=90_000)
    assert "effective-batch-size is at most 65536 on this server, got 70000" in page.inner_text("#cheapest")


# --------------------------------------------------------------------------- compare, exports, units


def test_compare_shows_the_differences_of_the_two_estimates_and_the_pin_round_trips(page, browser, served):
    """Pin a scenario, change the micro-batch: the comparison's columns are the two estimates of the API (the CLI's
    JSON for the same flags, byte for byte the API's) and each difference is theirs, current − pinned: the peak,
    the device total, every component at the peak, the time and the cost (provider aws in both, so the cost shown
    is that provider's). The pinned scenario is in the address: the link opens the same comparison."""
    first = {**START, "optim": "adamw_torch", "precision": "bf16-true", "provider": "aws", "per-device-train-batch-size": "2"}
    open_view(page, served, first)
    page.click("#pin")
    assert page.is_visible("#compare-card")
    pinned = dict(urllib.parse.parse_qsl(urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)["pin"][0]))
    assert pinned == first
    change_micro_batch(page, 6)
    page.wait_for_selector("#compare-table")
    second = {**first, "per-device-train-batch-size": "6"}
    a, b = cli_json(first), cli_json(second)
    got = compare_table(page)
    ma, mb = a["memory"], b["memory"]
    for row, va, vb in [("peak", ma["per_gpu_bytes"]["peak"], mb["per_gpu_bytes"]["peak"]),
                        ("device_total", ma["per_gpu_bytes"]["device_total"], mb["per_gpu_bytes"]["device_total"]),
                        ("usable", ma["usable_bytes"], mb["usable_bytes"])]:
        assert got[row] == [va, vb, vb - va], row
    assert got["peak"][2] > 0  # a larger micro-batch: more memory
    rows = {k: [ma["peak_breakdown_bytes"].get(k, 0), mb["peak_breakdown_bytes"].get(k, 0)]
            for k in {*ma["peak_breakdown_bytes"], *mb["peak_breakdown_bytes"]}}
    shown_rows = {k[4:]: v for k, v in got.items() if k.startswith("row:")}
    assert shown_rows == {k: [x, y, y - x] for k, (x, y) in rows.items() if x or y}
    assert sum(v[2] for v in shown_rows.values()) == got["peak"][2]  # the rows' differences add up to the peak's
    ta, tb = a["time"]["seconds"], b["time"]["seconds"]
    assert got["seconds"][:2] == [ta, tb] and got["seconds"][2] == pytest.approx(tb - ta, rel=1e-12)
    ca, cb = a["cost"]["on_demand_usd"], b["cost"]["on_demand_usd"]
    assert got["cost"][:2] == [ca, cb] and got["cost"][2] == pytest.approx(cb - ca, rel=1e-12)
    assert "micro-batch 2 → 6" in page.inner_text("#compare-diff")
    link = page.url
    other = browser.new_page()
    try:
        other.goto(link)
        other.wait_for_selector("#compare-table", timeout=20_000)
        assert compare_table(other) == got and other.evaluate("document.body.dataset.query") == page_query_text(page)
    finally:
        other.close()
    page.click("#unpin")
    assert page.is_hidden("#compare-card") and "pin=" not in page.url
    assert page.problems == []


def compare_table(page) -> dict[str, list]:
    """The comparison's rows: ``{row: [pinned, current, difference]}`` (the exact numbers, from data attributes)."""
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#compare-table tr[data-row]')]
        .filter(tr => tr.dataset.row !== 'fits').map(tr => [tr.dataset.row,
            [...tr.querySelectorAll('td')].map(td => Number(td.dataset.value ?? td.dataset.delta))]))""")


def page_query_text(page) -> str:
    return page.evaluate("document.body.dataset.query")


def test_the_estimate_exports_as_json_and_csv_and_prints_the_verdict_and_breakdown(page, served, tmp_path):
    """The JSON download is ``fitplan estimate --format json``'s text; the CSV's rows at the peak add up to the peak
    (and to the CLI's), its time is the CLI's; the print view shows the answer, the memory and time cards and hides
    the form, the GPU cards and the buttons."""
    import csv

    query = {**START, "optim": "adamw_torch", "provider": "lambda"}
    open_view(page, served, query)
    with page.expect_download() as info:
        page.click("#estimate-exports a[data-export=json]")
    assert info.value.suggested_filename == "fitplan-estimate.json"
    assert pathlib_text(info.value, tmp_path) == cli_output("estimate", *flags(query), "--format", "json")
    with page.expect_download() as info:
        page.click("#estimate-exports a[data-export=csv]")
    assert info.value.suggested_filename == "fitplan-estimate.csv"
    rows = list(csv.DictReader(pathlib_text(info.value, tmp_path).splitlines()))
    cli = cli_json(query)
    peak = next(int(r["value"]) for r in rows if (r["section"], r["name"]) == ("memory", "peak"))
    at_peak = [int(r["value"]) for r in rows if r["section"] == "peak"]
    assert sum(at_peak) == peak == cli["memory"]["per_gpu_bytes"]["peak"] and len(at_peak) >= 4
    assert next(float(r["value"]) for r in rows if (r["section"], r["name"]) == ("time", "seconds")) == cli["time"]["seconds"]
    assert next(float(r["value"]) for r in rows if r["name"] == "lambda.on_demand_usd") == cli["cost"]["on_demand_usd"]
    page.emulate_media(media="print")
    try:
        for shown_ in ("#answer", "#memory-card", "#chart svg", "#components", "#time-card"):
            assert page.is_visible(shown_), shown_
        for hidden in ("#form", "#gpus-card", "#cheapest-card", "#downloads-card", "#copy-link"):
            assert page.is_hidden(hidden), hidden
    finally:
        page.emulate_media(media="screen")
    assert page.is_visible("#form") and page.problems == []


def pathlib_text(download, tmp_path) -> str:
    path = tmp_path / download.suggested_filename
    download.save_as(path)
    return path.read_text(encoding="utf-8")


def test_the_gib_switch_divides_by_2_30_and_long_runs_read_in_days(page, served):
    """GiB: every byte figure over 2**30 (the peak in the table, the answer line's memory, the GPU card, the form's
    GPU choice), the GPU prices kept; a run over 48 hours reads in days (the CLI's seconds / 86,400)."""
    query = {**START, "optim": "adamw_torch", "num-examples": "2000000"}
    open_view(page, served, query)
    cli = cli_json(query)
    per, usable, seconds = cli["memory"]["per_gpu_bytes"], cli["memory"]["usable_bytes"], cli["time"]["seconds"]
    assert page.inner_text("#peak") == f"{per['peak'] / 1e9:,.2f} GB"
    page.wait_for_selector("#gpus[data-priced=true]", timeout=30_000)
    page.select_option("#unit", "GiB")
    assert page.inner_text("#peak") == f"{per['peak'] / 2**30:,.2f} GiB"
    assert f"{per['device_total'] / 2**30:.1f} of {usable / 2**30:.1f} GiB" in page.inner_text("#headline")
    card = page.inner_text("#gpus .gpu[data-gpu=a100-80gb] small")
    assert card == f"{per['device_total'] / 2**30:,.2f} GiB of {usable / 2**30:,.2f} GiB"
    assert page.get_attribute("#gpus", "data-priced") == "true"  # the prices stay through the switch
    option = page.eval_on_selector("#f-gpu", "s => s.selectedOptions[0].textContent")
    assert option.endswith(f"({usable / 2**30:,.2f} GiB)")  # the form's GPU choices too
    assert seconds > 48 * 3600  # by the dataset size chosen: 2M examples of 512 tokens
    assert page.inner_text("#time-value").startswith(f"{seconds / 86400:.1f} days")
    page.reload()
    page.wait_for_selector("body[data-state=ready]", timeout=20_000)
    assert page.inner_text("#peak").endswith(" GiB")  # kept in the browser's storage
    page.select_option("#unit", "GB")
    assert page.problems == []


def test_the_loss_implementation_is_a_choice_that_moves_the_logits_bar(page, served):
    """The form offers every loss implementation (hf, torchtune's chunked CE eager and compiled, Liger's fused
    linear cross-entropy, Cut CE); choosing one re-estimates, and the chart's logits bar is the CLI's ``logits``
    row at the peak for that choice (Llama-3.1-8B LoRA, batch 2 × 2048, checkpointed: each keeps different bytes)."""
    query = {"model": "llama-3.1-8b", "gpu": "a100-80gb", "precision": "bf16-true", "optim": "adamw_torch_fused",
             "method": "lora", "per-device-train-batch-size": "2", "max-seq-length": "2048",
             "gradient-checkpointing": "true"}
    open_view(page, served, query)
    options = page.eval_on_selector("#f-loss-implementation", "s => [...s.options].map(o => o.value)")
    assert {"hf", "chunked", "chunked_compiled", "liger", "cce"} <= set(options)
    logits = {}
    for loss in ("chunked", "chunked_compiled", "liger", "hf"):
        page.select_option("#f-loss-implementation", loss)
        # the default (hf) leaves the link, as every default does
        page.wait_for_function("""([want, dflt]) => {
            const q = (document.body.dataset.query || '').split('&');
            const ok = dflt ? !q.some(p => p.startsWith('loss-implementation=')) : q.includes(want);
            return ok && document.body.dataset.state === 'ready'; }""",
                               arg=[f"loss-implementation={loss}", loss == "hf"], timeout=20_000)
        bars = dict(shown(page)["bars"])
        want = cli_json({**query, "loss-implementation": loss})["memory"]["peak_breakdown_bytes"]["logits"]
        assert bars.get("logits", 0) == want
        logits[loss] = want
    assert len(set(logits.values())) == 4  # the four choices keep different logits bytes at their peaks
    assert page.problems == []


def test_activation_offloading_is_a_choice_of_its_declared_modes(page, served):
    # a Setting of builtin/activations.py: the form builds its field from the declaration (/api/options), and a
    # link that sets it gives the CLI's numbers
    query = {**START, "activation-offloading": "trl_sync"}
    open_view(page, served, query)
    field = page.eval_on_selector("#f-activation-offloading",
                                  "e => [e.tagName, [...e.options].map(o => o.value), e.value]")
    assert field == ["SELECT", ["none", "torchtune", "trl", "trl_sync", "unsloth"], "trl_sync"]
    cli = cli_json(query)["memory"]
    assert shown(page)["peak"] == cli["per_gpu_bytes"]["peak"]
    assert page.problems == []
