"""``fitplan serve``'s page in a real browser: Debian's Chromium, driven by playwright (pointed at that binary;
playwright's own browser download is not used). Skipped without Chromium, except under ``.ci/run``
(``FITPLAN_REQUIRE_BROWSER=1``), where a missing browser fails.

The page is loaded, the micro-batch changed across the fits boundary (the chart and the verdict must follow,
within 200 ms of the input event in the median of five changes, measured in the page), a shared link must
reproduce the view, an export is downloaded and read back by the CLI, a number's derivation is opened, a
config.json is uploaded, and a screenshot is kept (under pytest's tmp dir; also in ``$FITPLAN_ARTIFACTS`` when
set). The expected numbers are the CLI's (``fitplan estimate --format json`` for the same flags). About 20 s.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import urllib.parse

import pytest

from conftest import ROOT, chromium_path, require_modules
from test_serve import cli_output, flags

SLIDER_MS = 200
"""A micro-batch change must be on the page within this long (the issue's goal), in the median of five changes."""
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
    the verdict and the chart show the estimate of the new value (measured in the page)."""
    return page.evaluate("""async (value) => {
        const input = document.getElementById('f-per-device-train-batch-size');
        const want = 'per-device-train-batch-size=' + value;
        const t0 = performance.now();
        input.value = String(value);
        input.dispatchEvent(new Event('input', {bubbles: true}));
        await new Promise((resolve, reject) => {
            const done = () => (document.body.dataset.query || '').split('&').includes(want)
                && document.body.dataset.state === 'ready';
            if (done()) return resolve();
            const obs = new MutationObserver(() => { if (done()) { obs.disconnect(); resolve(); } });
            obs.observe(document.body, {attributes: true, subtree: true, childList: true});
            setTimeout(() => { obs.disconnect(); reject(new Error('not rendered after 10 s: state ' +
                document.body.dataset.state + ', ' + document.body.dataset.query + ', ' + location.search + ', ' + document.getElementById('error').textContent)); }, 10000);
        });
        return performance.now() - t0;
    }""", value)


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
    print(f"micro-batch change on the page: {', '.join(f'{t:.0f}' for t in times)} ms")
    # the median of five changes: a loaded machine (CI shares its two cores with the browser) delays single ones
    assert statistics.median(times) < SLIDER_MS, times
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
