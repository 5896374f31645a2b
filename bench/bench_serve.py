"""Latency of ``GET /api/estimate`` against a running ``fitplan serve`` (goal: p95 under 20 ms).

Starts ``fitplan serve --port 0`` in a subprocess (needs the web extra: ``pip install -e '.[web]'``), then
times requests from one keep-alive HTTP connection, as the page makes them:

* ``repeat``: the same scenario again and again (the README's example with a dataset);
* ``slider``: the micro-batch and sequence length moving through values, each scenario asked for several
  times in a row (what a slider drag sends);
* ``new shapes``: every request a micro-batch × sequence never asked before (each builds a new step trace:
  the cold case).

    python bench/bench_serve.py [N]      # N requests per case (default 300)

Prints p50 / p95 / max of the wall time per case, and the server's CPU time per request. Run it on an idle
machine: on a loaded one the wall time grows with the load, the CPU time much less.
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
BASE = {"model": "llama-2-7b", "gpu": "a100-80gb", "precision": "bf16-mixed", "gradient-checkpointing": "true",
        "num-examples": "10000", "tokens-per-example": "512"}


def start() -> tuple[subprocess.Popen, str, int]:
    proc = subprocess.Popen([sys.executable, "-m", "fitplan", "serve", "--port", "0"], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    line = proc.stderr.readline()
    m = re.search(r"http://([^/\s]+):(\d+)/", line)
    if m is None:
        proc.kill()
        raise SystemExit(f"fitplan serve did not start: {line}{proc.stderr.read()}")
    return proc, m.group(1), int(m.group(2))


def timed(conn: http.client.HTTPConnection, query: dict[str, str]) -> float:
    t0 = time.perf_counter()
    conn.request("GET", "/api/estimate?" + urllib.parse.urlencode(query))
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
    """Time the requests ``run()`` makes; print p50 / p95 / max of the wall time and the server's CPU time per
    request (less sensitive to a loaded machine than the wall time)."""
    c0 = cpu_seconds(pid)
    ms = sorted(run())
    c1 = cpu_seconds(pid)
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    cpu = f"   server CPU {1e3 * (c1 - c0) / len(ms):5.2f} ms/request" if c0 is not None and c1 is not None else ""
    print(f"{name:>11}: p50 {statistics.median(ms):6.2f} ms   p95 {p95:6.2f} ms   max {ms[-1]:6.2f} ms   "
          f"({len(ms)} requests){cpu}")
    return p95


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    proc, host, port = start()
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
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    worst = max(repeat, slider)
    print(f"goal: p95 under {GOAL_MS:.0f} ms for a scenario the server has seen: "
          f"{'met' if worst < GOAL_MS else 'NOT met'} ({worst:.2f} ms); new shapes p95 {fresh:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
