"""Render a `fitplan recommend --format html` report in headless Chromium and write a PNG screenshot.

Checks by eye that the self-contained report (inline CSS and SVG, no JavaScript, no network) renders.
Needs Debian's `chromium` (`apt-get install -y chromium`); the test suite does not.

    python bench/html_screenshot.py [OUT.png]

Writes the report next to the PNG (OUT.html) and prints both paths.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ARGS = ["--model", "llama-2-13b", "--num-examples", "50000", "--tokens-per-example", "1024", "--num-train-epochs", "2",
        "--objective", "cost", "--policy", str(Path(__file__).resolve().parents[1] / "rulesets/examples/policy-example.toml")]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "fitplan-report.png").resolve()
    html = out.with_suffix(".html")
    subprocess.run([sys.executable, "-m", "fitplan", "recommend", *ARGS, "--format", "html", "--out", str(html)], check=True)
    browser = find_chromium()
    if browser is None:
        print("chromium not found: apt-get install -y chromium", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={out}", "--window-size=1280,2000",
                        html.as_uri()], check=True, capture_output=True, timeout=120)
    print(f"report: {html}")
    print(f"screenshot: {out} ({out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
