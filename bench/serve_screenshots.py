"""Screenshots of ``fitplan serve``'s page for review: a scenario that fits and one that does not, at 1400 px and
at 390 px (a phone), light and dark; a comparison (a pinned scenario beside another); the print view. Starts its own server on a free port; drives Debian's ``chromium`` through
playwright (``make install-test``; ``apt-get install -y chromium``).

    python bench/serve_screenshots.py [OUT_DIR]     # default /tmp/fitplan-screenshots; `make screenshots DIR=...`

Prints the paths of the PNGs it wrote.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
import urllib.parse
from pathlib import Path

FITS = {"model": "llama-2-7b", "gpu": "a100-80gb", "precision": "bf16-true", "optim": "adamw_torch",
        "per-device-train-batch-size": "2", "gradient-checkpointing": "true", "num-examples": "10000",
        "tokens-per-example": "512"}
NOT_FITS = {"model": "llama-2-70b", "gpu": "a100-80gb", "method": "full", "precision": "bf16-mixed", "optim": "adamw_torch",
            "num-examples": "10000", "tokens-per-example": "512"}
COMPARE = {**FITS, "per-device-train-batch-size": "6", "pin": urllib.parse.urlencode(FITS)}
"""A comparison: the pinned scenario (``pin``, its query) is FITS, the current one FITS at micro-batch 6."""
SHOTS = [("fits-1400", FITS, 1400, "light"), ("fits-390", FITS, 390, "light"), ("not-fits-1400", NOT_FITS, 1400, "light"),
         ("not-fits-390-dark", NOT_FITS, 390, "dark"), ("fits-1400-dark", FITS, 1400, "dark"),
         ("compare-1400", COMPARE, 1400, "light"), ("compare-390-dark", COMPARE, 390, "dark")]


def serve():
    from fitplan.web.api import Settings
    from fitplan.web.server import make_server, warm_up

    settings = Settings()
    warm_up(settings)
    server, sock, url = make_server(settings, "127.0.0.1", 0)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    return server, url


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/fitplan-screenshots")
    out.mkdir(parents=True, exist_ok=True)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("chromium not found: apt-get install -y chromium", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    server, url = serve()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        for name, query, width, scheme in SHOTS:
            page = browser.new_page(viewport={"width": width, "height": 900}, color_scheme=scheme)
            page.goto(url + "?" + urllib.parse.urlencode(query))
            page.wait_for_selector("body[data-state=ready]", timeout=30_000)
            page.wait_for_selector("#largest[data-state=ready]", timeout=30_000)
            page.wait_for_selector("#gpus[data-priced=true]", timeout=30_000)
            page.wait_for_selector("#cheapest:is([data-state=ready], [data-state=none], [data-state=error])", timeout=90_000)
            if "pin" in query:
                page.wait_for_selector("#compare-table", timeout=30_000)
            path = out / f"fitplan-serve-{name}.png"
            page.screenshot(path=str(path), full_page=True)
            print(path)
            if name.startswith("fits"):  # a derivation, opened beside its number
                page.click("#peak")
                page.wait_for_selector("#explain .tree", timeout=30_000)
                shot = out / f"fitplan-serve-{name}-derivation.png"
                page.screenshot(path=str(shot))
                print(shot)
            if width < 800:  # the first screen, at full size
                top = out / f"fitplan-serve-{name}-top.png"
                page.screenshot(path=str(top))
                print(top)
            if name == "fits-1400":  # the print view (the print stylesheet) as a PDF-like screenshot
                page.emulate_media(media="print")
                shot = out / "fitplan-serve-print.png"
                page.screenshot(path=str(shot), full_page=True)
                print(shot)
            page.close()
        browser.close()
    server.should_exit = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
