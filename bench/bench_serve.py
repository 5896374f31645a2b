"""Latency of ``fitplan serve``: ``GET /api/estimate`` (goals: p95 under 20 ms for a scenario the server has seen,
under 50 ms for a never-seen shape) and, in Chromium, the page's input-to-verdict time (goal: median under 150 ms).

Starts ``fitplan serve --port 0`` in a subprocess (needs the web extra: ``pip install -e '.[web]'``), then
times requests from one keep-alive HTTP connection, as the page makes them:

* ``repeat``: the same scenario again and again (the README's example with a dataset);
* ``slider``: the micro-batch and sequence length moving through values, each scenario asked for several
  times in a row (what a slider drag sends);
* ``new shapes``: every request a micro-batch × sequence never asked before (each builds new step traces, the
  scenario's and those of the advice variants whose condition can still hold: the cold case); ``view new``: the
  same for ``/api/view``, the page's request (``advice=later&gpus=later``: the advice and the scenario on every
  GPU come from ``/api/advice`` and ``/api/gpus`` after the verdict; priced by every provider besides).

Then, when playwright and Debian's ``chromium`` are installed (``make install-test``), the page itself: the time
from an input event on the micro-batch field to the new verdict and chart on the page (``body[data-state=ready]``
with the new query; measured in the page with ``performance.now()`` by :mod:`fitplan.web.page_timing`, which
tests/test_serve_browser.py uses too), for
values seen before and for never-seen micro-batch × sequence shapes; median and p90.

    python bench/bench_serve.py [N] [--no-page]   # N requests per case (default 300; the page: N // 10 changes
                                                  # per case; --no-page: the API's cases only)

Prints p50 / p95 / max of the wall time per case, and the server's CPU time per request. Run it on an idle
machine: on a loaded one the wall time grows with the load, the CPU time much less. The disk cache of step
traces is pointed at an empty temporary directory, so that "never seen" holds across runs.
"""

from __future__ import annotations

import http.client
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.parse

GOAL_MS = 20.0
NEW_GOAL_MS = 50.0
PAGE_GOAL_MS = 150.0
BASE = {"model": "llama-2-7b", "gpu": "a100-80gb", "precision": "bf16-mixed", "gradient-checkpointing": "true",
        "num-examples": "10000", "tokens-per-example": "512"}


def start(cache_dir: str) -> tuple[subprocess.Popen, str, int]:
    env = {**os.environ, "FITPLAN_CACHE_DIR": cache_dir}  # nothing kept from an earlier run: new shapes are new
    proc = subprocess.Popen([sys.executable, "-m", "fitplan", "serve", "--port", "0"], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env=env)
    line = proc.stderr.readline()
    m = re.search(r"http://([^/\s]+):(\d+)/", line)
    if m is None:
        proc.kill()
        raise SystemExit(f"fitplan serve did not start: {line}{proc.stderr.read()}")
    return proc, m.group(1), int(m.group(2))


def timed(conn: http.client.HTTPConnection, query: dict[str, str], endpoint: str = "estimate") -> float:
    t0 = time.perf_counter()
    conn.request("GET", f"/api/{endpoint}?" + urllib.parse.urlencode(query))
    r = conn.getresponse()
    body = r.read()
    dt = time.perf_counter() - t0
    if r.status != 200:
        raise SystemExit(f"HTTP {r.status}: {body[:300]!r}")
    return dt * 1e3


def cpu_seconds(pid: int) -> float | None:
    """The server process's CPU time (user + system), from /proc (Linux); None elsewhere."""
    try:
        fields = open(f"/proc/{pid}/stat", encoding="ascii").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def measure(name: str, pid: int, run) -> float:
    """Time the requests ``run()`` makes; print p50 / p95 / max of the wall time, the server's CPU time per
    request (less sensitive to a loaded machine than the wall time) and the load average when they ended."""
    c0 = cpu_seconds(pid)
    ms = sorted(run())
    c1 = cpu_seconds(pid)
    p95 = percentile(ms, 0.95)
    cpu = f"   server CPU {1e3 * (c1 - c0) / len(ms):5.2f} ms/request" if c0 is not None and c1 is not None else ""
    print(f"{name:>11}: p50 {statistics.median(ms):6.2f} ms   p95 {p95:6.2f} ms   max {ms[-1]:6.2f} ms   "
          f"({len(ms)} requests){cpu}{load_average()}")
    return p95


def load_average() -> str:
    """``   load N.N`` (the last minute's load average, where the system tells it): the wall times above grow with
    it."""
    try:
        return f"   load {os.getloadavg()[0]:.1f}"
    except (AttributeError, OSError):
        return ""


def percentile(ms: list[float], q: float) -> float:
    ms = sorted(ms)
    return ms[min(len(ms) - 1, int(q * len(ms)))]


def page_times(url: str, n: int, pause_ms: int = 300) -> dict[str, list[float]] | None:
    """Input-to-verdict times in Chromium: ``seen`` (micro-batch values asked before) and ``new`` (a never-seen
    sequence length, then micro-batch, each change a new shape). None without playwright or chromium."""
    import shutil

    chromium = os.environ.get("FITPLAN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if chromium is None:
        return None
    from fitplan.web.page_timing import input_to_verdict_ms

    out: dict[str, list[float]] = {"seen": [], "new": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url + "?" + urllib.parse.urlencode(BASE))
        page.wait_for_selector("body[data-state=ready]", timeout=60_000)
        for b in (3, 4, 5, 2):  # seen once before timing (1, the default, is not in the query)
            input_to_verdict_ms(page, "per-device-train-batch-size", b)
        for i in range(n):
            page.wait_for_timeout(pause_ms)  # a user's pause: the later requests (prices, largest) start and run
            out["seen"].append(input_to_verdict_ms(page, "per-device-train-batch-size", 2 + (i + 1) % 4))
        for i in range(n):
            page.wait_for_timeout(pause_ms)
            field, value = ("max-seq-length", str(2500 + i)) if i % 2 == 0 else ("per-device-train-batch-size", str(5 + i))
            out["new"].append(input_to_verdict_ms(page, field, value))
        browser.close()
    return out


def main() -> int:
    import tempfile

    args = [a for a in sys.argv[1:] if a != "--no-page"]
    n = int(args[0]) if args else 300
    cache = tempfile.TemporaryDirectory(prefix="fitplan-bench-cache-")
    proc, host, port = start(cache.name)
    try:
        conn = http.client.HTTPConnection(host, port, timeout=60)
        for _ in range(20):  # warm-up: imports, rulesets, the first step traces
            timed(conn, BASE)
        pid = proc.pid
        repeat = measure("repeat", pid, lambda: [timed(conn, BASE) for _ in range(n)])
        sizes = [(b, s) for s in (512, 1024, 2048, 4096) for b in range(1, 9)]
        for b, s in sizes:  # the slider's values, once each before timing
            timed(conn, {**BASE, "per-device-train-batch-size": str(b), "max-seq-length": str(s)})
        slider = measure("slider", pid, lambda: [
            timed(conn, {**BASE, "per-device-train-batch-size": str(b), "max-seq-length": str(s)})
            for i in range(n) for b, s in [sizes[(i // 4) % len(sizes)]]])
        fresh = measure("new shapes", pid, lambda: [
            timed(conn, {**BASE, "per-device-train-batch-size": str(9 + i % 40), "max-seq-length": str(3000 + i)})
            for i in range(min(n, 200))])
        measure("view new", pid, lambda: [
            timed(conn, {**BASE, "per-device-train-batch-size": str(9 + i % 40), "max-seq-length": str(5000 + i),
                         "advice": "later", "gpus": "later"}, "view")
            for i in range(min(n, 100))])
        conn.close()
        page = None if "--no-page" in sys.argv else page_times(f"http://{host}:{port}/", max(n // 10, 10))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        cache.cleanup()
    worst = max(repeat, slider)
    print(f"goal: p95 under {GOAL_MS:.0f} ms for a scenario the server has seen: "
          f"{'met' if worst < GOAL_MS else 'NOT met'} ({worst:.2f} ms)")
    print(f"goal: p95 under {NEW_GOAL_MS:.0f} ms for a never-seen shape: "
          f"{'met' if fresh < NEW_GOAL_MS else 'NOT met'} ({fresh:.2f} ms)")
    if page is None:
        print("the page: not measured (--no-page, or playwright or chromium missing: make install-test)")
        return 0
    for case, ms in page.items():
        print(f"page, input to verdict, {case:>4}: median {statistics.median(ms):6.1f} ms   "
              f"p90 {percentile(ms, 0.9):6.1f} ms   max {max(ms):6.1f} ms   ({len(ms)} changes){load_average()}")
    median = statistics.median(page["new"])
    print(f"goal: input to verdict under {PAGE_GOAL_MS:.0f} ms in the median for a never-seen shape: "
          f"{'met' if median < PAGE_GOAL_MS else 'NOT met'} ({median:.1f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
