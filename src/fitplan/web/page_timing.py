"""How long the page takes from an input event to the new verdict: the one measurement that both
``bench/bench_serve.py`` (its goal: a median under 150 ms) and ``tests/test_serve_browser.py`` (which prints it)
make in Chromium, driven by playwright. Nothing in the server imports this module.

The time is taken in the page with ``performance.now()``: from dispatching an ``input`` event on a form field
to the moment ``body[data-state=ready]`` carries the new value in ``body[data-query]`` (the verdict, chart and
tables are rendered in the same task that sets it: ``static/app.js`` ``load``).
"""

from __future__ import annotations

from typing import Any

CHANGE = """async ([name, value, timeoutMs]) => {
    const input = document.getElementById('f-' + name);
    const want = new URLSearchParams([[name, String(value)]]).toString();  // as the page writes its query
    const t0 = performance.now();
    input.value = String(value);
    input.dispatchEvent(new Event('input', {bubbles: true}));
    await new Promise((resolve, reject) => {
        const done = () => (document.body.dataset.query || '').split('&').includes(want)
            && document.body.dataset.state === 'ready';
        if (done()) return resolve();
        const obs = new MutationObserver(() => { if (done()) { obs.disconnect(); resolve(); } });
        obs.observe(document.body, {attributes: true, subtree: true, childList: true});
        setTimeout(() => { obs.disconnect(); reject(new Error(`not rendered after ${timeoutMs} ms: state ` +
            document.body.dataset.state + ', ' + document.body.dataset.query + ', ' + location.search + ', ' +
            document.getElementById('error').textContent)); }, timeoutMs);
    });
    return performance.now() - t0;
}"""
"""The page function: set field ``f-NAME`` to ``value``, fire one ``input`` event, resolve with the milliseconds
until the page shows the estimate of the new value (reject after ``timeoutMs``)."""


def input_to_verdict_ms(page: Any, name: str, value: Any, timeout_ms: int = 20_000) -> float:
    """Type ``value`` into the form field of flag ``name`` on playwright ``page`` as a user would (one input
    event) and return the milliseconds until the verdict shows it (:data:`CHANGE`)."""
    return page.evaluate(CHANGE, [name, str(value), timeout_ms])
