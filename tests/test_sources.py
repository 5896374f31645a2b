"""Citations stay public: no tracked file points outside the repository, and docs/sources.md lists every web host
that a ruleset `source` names.

The forbidden strings are a private briefing note that is not in the repository and the paths of the folder it
lives in; a citation of either is unreadable for anyone with only a clone. They are spelled in two pieces below so
that this file does not match itself.
"""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

FORBIDDEN = ("DOMAIN" + ".md", "/work/" + "shared", "../" + "shared", "shared/" + "seed/")

SOURCE_FIELD = re.compile(r'^\s*source\s*=\s*"([^"]*)"', re.M)
SCHEME_URL_HOST = re.compile(r"https?://([A-Za-z0-9.-]+)")
# a host written without its scheme, followed by a path: "github.com/pytorch/torchtune", "nebius.com/prices"
BARE_URL_HOST = re.compile(r"(?<![\w.@/-])((?:[a-z0-9-]+\.)+[a-z]{2,})/(?=\w)")


def url_hosts(text: str) -> set[str]:
    """The web hosts named in ``text``, with or without a scheme, lower-cased."""
    return {h.lower() for h in SCHEME_URL_HOST.findall(text) + BARE_URL_HOST.findall(text)}


def tracked_files() -> list[pathlib.Path]:
    """Every regular file git tracks in this checkout (symlinks left out)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    paths = [ROOT / p for p in out.decode().split("\0") if p]
    return [p for p in paths if p.is_file() and not p.is_symlink()]


def test_url_hosts_reads_both_spellings():
    text = 'see https://www.runpod.io/pricing and github.com/pytorch/torchtune README.md, not vms.csv/ or a.b'
    assert url_hosts(text) == {"www.runpod.io", "github.com"}


def test_no_tracked_file_cites_material_outside_the_repository():
    files = tracked_files()
    assert len(files) > 100  # the listing worked
    offenders = []
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="ignore")
        for needle in FORBIDDEN:
            if needle in text:
                line = text.count("\n", 0, text.index(needle)) + 1
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {needle}")
    assert offenders == []


def test_every_ruleset_source_host_is_listed_in_docs_sources():
    used: dict[str, set[str]] = {}
    for path in sorted((ROOT / "rulesets").rglob("*.toml")):
        for source in SOURCE_FIELD.findall(path.read_text(encoding="utf-8")):
            for host in url_hosts(source):
                used.setdefault(host, set()).add(str(path.relative_to(ROOT)))
    assert {"huggingface.co", "github.com", "www.nvidia.com", "aws.amazon.com"} <= set(used)  # the scan worked
    listed = url_hosts((ROOT / "docs" / "sources.md").read_text(encoding="utf-8"))
    missing = {host: sorted(files) for host, files in used.items() if host not in listed}
    assert missing == {}
