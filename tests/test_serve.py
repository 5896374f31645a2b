"""``fitplan serve``'s JSON API, against a running server: the same JSON and errors as the command line, the
local-server protections (Host, Origin, no local paths, bounded work), uploads and exports read back.

Expected values come from the CLI itself (``fitplan estimate --format json`` for the same flags): the API's
promise is to be that command, so the command is the independent reference. The page is tested in a real
browser in test_serve_browser.py.
"""

from __future__ import annotations

import http.client
import socket
import json
import re
import urllib.error
import urllib.parse
import urllib.request
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, require_modules, run_cli

TINY = ROOT / "tests/data/configs/tiny-llama/config.json"
EXAMPLE = {"model": "llama-2-7b", "gpu": "a100-80gb", "per-device-train-batch-size": "4",
           "gradient-checkpointing": "true"}
"""The issue's example query."""


def flags(query: dict[str, str]) -> list[str]:
    """The CLI flags of a query (the documented mapping: ``name=value`` -> ``--name value``, booleans as flags)."""
    out: list[str] = []
    for k, v in query.items():
        if v in ("true", "false"):
            out.append(f"--{k}" if v == "true" else f"--no-{k}")
        else:
            out += [f"--{k}", v]
    return out


def cli_output(*args: str) -> str:
    """stdout of the ``fitplan`` command line, in process (click's runner)."""
    from fitplan.cli import cli, load_commands

    load_commands()
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def get(served, path: str, query: dict[str, str] | list[tuple[str, str]] | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    url = served.url.rstrip("/") + path + ("?" + urllib.parse.urlencode(query) if query else "")
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read(), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, e.read(), {k.lower(): v for k, v in e.headers.items()}


def raw(served, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None):
    """A request with exactly these headers (``Host`` included), through http.client."""
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    for k, v in (headers or {}).items():
        conn.putheader(k, v)
    if body is not None:
        conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    r = conn.getresponse()
    out = r.status, r.read()
    conn.close()
    return out


@pytest.fixture(scope="module", autouse=True)
def _web_extra():
    require_modules("starlette", "uvicorn")


# --------------------------------------------------------------------------- the same JSON as the CLI


def test_estimate_is_the_cli_output_byte_for_byte(served):
    status, body, headers = get(served, "/api/estimate", EXAMPLE)
    proc = run_cli("estimate", *flags(EXAMPLE), "--format", "json")  # the real command line, in a subprocess
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert body.decode("utf-8") == proc.stdout


@pytest.mark.parametrize("query", [
    {"model": "llama-2-13b", "gpu": "h100-sxm", "num-gpus": "8", "zero": "3", "precision": "bf16-master",
     "num-examples": "50000", "tokens-per-example": "1024", "provider": "aws"},
    {"model": "mistral-7b", "method": "qlora", "lora-r": "16", "lora-target-modules": "all-linear", "precision": "bf16-true",
     "gpu": "rtx-4090", "max-seq-length": "4096", "attn-implementation": "flash_attention_2"},
    {"params": "7B", "precision": "32-true", "assumptions": "seed"},
    {"model": "llama-2-7b", "bf16": "true", "optim": "adamw_8bit", "gradient-accumulation-steps": "8", "tf32": "false"},
])
def test_estimate_matches_the_cli_for_other_scenarios(served, query):
    status, body, _ = get(served, "/api/estimate", query)
    assert status == 200, body
    assert body.decode("utf-8") == cli_output("estimate", *flags(query), "--format", "json")


def test_explain_models_gpus_and_largest_match_the_cli(served):
    q = {**EXAMPLE, "quantity": "peak", "depth": "2"}
    assert get(served, "/api/explain", q)[1].decode() == cli_output("explain", "peak", *flags(EXAMPLE), "--depth", "2",
                                                                     "--format", "json")
    assert get(served, "/api/models")[1].decode() == cli_output("models", "list", "--format", "json")
    q = {**EXAMPLE, "max": "micro-batch", "headroom": "0.1"}
    assert get(served, "/api/recommend", q)[1].decode() == cli_output(
        "recommend", *flags(EXAMPLE), "--max", "micro-batch", "--headroom", "0.1", "--format", "json")
    status, body, _ = get(served, "/api/gpus", {"model": "llama-2-7b", "precision": "bf16-true"})
    rows = {r["id"]: r for r in json.loads(body)}
    for gpu in ("a100-40gb", "h100-sxm"):
        cli = json.loads(cli_output("estimate", "--model", "llama-2-7b", "--precision", "bf16-true", "--gpu", gpu,
                                    "--format", "json"))
        assert rows[gpu]["memory"] == cli["memory"]


def test_recommend_matches_the_cli_but_its_timings(served):
    q = {"model": "llama-2-7b", "num-examples": "20000", "tokens-per-example": "512", "gpus": "a100-80gb,h100-sxm",
         "providers": "aws,lambda", "methods": "lora", "precisions": "bf16-mixed", "optims": "adamw_torch", "top": "3"}
    status, body, _ = get(served, "/api/recommend", q)
    assert status == 200, body
    api, cli = json.loads(body), json.loads(cli_output("recommend", *flags(q), "--format", "json"))
    for report in (api, cli):
        report["search"].pop("seconds", None)
    assert api == cli and api["plans"]


# --------------------------------------------------------------------------- bad input: 400, the CLI's text


@pytest.mark.parametrize("query, cli_args", [
    ({"model": "llama-2-7b", "per-device-train-batch-size": "x"}, ["--per-device-train-batch-size", "x"]),
    ({"model": "llama-2-7c"}, ["--model", "llama-2-7c"]),
    ({"model": "llama-2-7b", "precision": "bf17"}, ["--model", "llama-2-7b", "--precision", "bf17"]),
    ({"model": "llama-2-7b", "method": "lora", "lora-r": "99999"}, ["--model", "llama-2-7b", "--method", "lora", "--lora-r", "99999"]),
])
def test_bad_input_is_400_with_the_cli_message(served, query, cli_args):
    status, body, _ = get(served, "/api/estimate", query)
    proc = run_cli("estimate", *cli_args)
    assert status == 400 and proc.returncode == 2
    assert json.loads(body)["error"] in proc.stderr.replace("\n", " ") or \
        " ".join(json.loads(body)["error"].split()) in " ".join(proc.stderr.split())


@pytest.mark.parametrize("query", [
    {"model": "/etc/passwd"}, {"model": "../../etc/passwd"}, {"model": str(TINY)},
    {"model": "tests/data/configs/tiny-llama/config.json"}, {"model": "tests/data/configs/tiny-llama"},
    {"model": "config.json"}, {"model": "~/x"}, {"model": "tests"},
    {"deepspeed": "ds.json"}, {"training-args": "args.json"}, {"ruleset-dir": "/tmp"}, {"scenario-file": "a.toml"},
    {"policy": "p.toml"}, {"gpu": "../a100-80gb"},
])
def test_no_query_parameter_reads_a_local_path(served, query):
    status, body, _ = get(served, "/api/estimate", query)
    assert status == 400
    error = json.loads(body)["error"]
    assert "reads no local file" in error or "unknown query parameter" in error


def test_numbers_are_not_mistaken_for_paths(served):
    status, body, _ = get(served, "/api/estimate", {"model": "llama-2-7b", "mfu": ".4", "gpu": "a100-80gb"})
    assert status == 200 and json.loads(body)["scenario"]["cost"]["mfu"] == 0.4


def test_a_hub_id_is_not_read_as_a_path(served):
    status, body, _ = get(served, "/api/estimate", {"model": "some-org/some-model"})
    error = json.loads(body)["error"]
    assert status == 400 and "reads no local file" not in error  # resolved (or refused) as a model id, not a path


VALUES = st.sampled_from(["", "0", "1", "-3", "2.5", "1e40", "99999999999999999999", "true", "no", "abc", "llama-2-7b",
                          "a100-80gb", "bf16-mixed", "lora", "full_shard", "aws", "q_proj,v_proj", "7B", "upload:00",
                          "org/name", "/etc/passwd", "..", "x" * 600, "\x00", "é", "nan", "inf"])
KEYS = st.sampled_from(["model", "params", "gpu", "per-device-train-batch-size", "max-seq-length", "precision", "method",
                        "lora-r", "zero", "fsdp", "num-gpus", "tensor-parallel", "num-examples", "tokens-per-example",
                        "provider", "mfu", "optim", "bf16", "gradient-checkpointing", "quantity", "nope"])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(KEYS, VALUES), max_size=6), st.sampled_from(["view", "estimate", "explain", "gpus"]))
def test_no_query_makes_a_server_error(served, query, endpoint):
    from fitplan.web import api, view
    from fitplan.web.server import guarded

    func = {"view": view.view, "estimate": api.estimate, "explain": api.explain, "gpus": api.gpus}[endpoint]
    reply = guarded(func, served.settings, [("model", "llama-2-7b"), *query] if endpoint != "gpus" else query)
    assert reply.status in (200, 400), reply.body


def test_search_work_is_bounded(served):
    base = {"model": "llama-2-7b", "num-examples": "1000", "tokens-per-example": "100"}
    for name, too_many in (("top", "101"), ("max-gpus", "65"), ("max-nodes", "9"), ("effective-batch-size", "70000")):
        status, body, _ = get(served, "/api/recommend", {**base, name: too_many})
        assert status == 400 and "at most" in json.loads(body)["error"]
    from fitplan.web import api

    quick = api.Settings(search_seconds=0.0)  # past the limit at the first progress report
    reply = api.answer(api.recommend, quick, list(base.items()))
    assert reply.status == 400 and "ran past" in json.loads(reply.body)["error"]
    quick.search_lock.acquire()
    assert api.answer(api.recommend, quick, list(base.items())).status == 429
    quick.uploads.close()


def test_the_view_gives_the_cheapest_cards_search(served):
    """``/api/view``'s ``cheapest``: the page's scenario less the fields a plan chooses (GPU, count, nodes,
    provider, region, micro-batch, accumulation, checkpointing, ZeRO, offload, attention), with the page's
    effective batch (by hand: micro-batch 3 × accumulation 2 × (4 GPUs × 2 nodes / tensor-parallel 2) = 24), ranked
    by cost with a dataset size, by GPUs without one; the reply waits for a running search (the server's limit)."""
    keep = {"model": "llama-2-7b", "precision": "bf16-master", "optim": "adamw_torch_fused", "tensor-parallel": "2",
            "max-seq-length": "1024"}
    plan = {"gpu": "h100-sxm", "num-gpus": "4", "num-nodes": "2", "provider": "aws", "per-device-train-batch-size": "3",
            "gradient-accumulation-steps": "2", "gradient-checkpointing": "true", "zero": "1",
            "attn-implementation": "eager"}
    sized = {"num-examples": "1000", "tokens-per-example": "256"}
    status, body, _ = get(served, "/api/view", {**keep, **plan, **sized})
    assert status == 200, body
    card = json.loads(body)["cheapest"]
    assert urllib.parse.parse_qsl(card["query"]) == [*keep.items(), *sized.items(), ("effective-batch-size", "24"),
                                                     ("objective", "cost"), ("top", "1"), ("wait", "60")]
    assert (card["effective_batch_size"], card["dataset_size"]) == (24, True)
    assert set(plan) | {"instance", "region", "offload-optimizer", "offload-params"} == set(card["searched"])
    card = json.loads(get(served, "/api/view", {**keep, **plan})[1])["cheapest"]
    assert dict(urllib.parse.parse_qsl(card["query"]))["objective"] == "gpus" and card["dataset_size"] is False


def test_the_later_work_of_an_older_view_is_stopped(served):
    """``page=ID&view=N`` on a page's later requests (prices, largest values, the cheapest plan's search): once
    that page has asked for a newer ``/api/view``, the server stops that work (409) instead of spending the next
    view's CPU on work the page abandoned; another page's views, a view without ``page`` and a request without
    ``view`` stop nothing, and the newest view's requests are answered as before."""
    q = {"model": "llama-2-7b", "gpu": "a100-80gb", "precision": "bf16-true", "optim": "adamw_torch",
         "num-examples": "1000", "tokens-per-example": "512"}
    old = json.loads(get(served, "/api/view", {**q, "page": "p1"})[1])["view"]
    other = json.loads(get(served, "/api/view", {**q, "page": "p2"})[1])["view"]  # another page: stops nothing of p1
    assert get(served, "/api/largest", {**q, "page": "p1", "view": str(old)})[0] == 200 and other > old
    assert json.loads(get(served, "/api/view", q)[1])["view"] is None  # no page (the pinned scenario's): counts not
    new = json.loads(get(served, "/api/view", {**q, "per-device-train-batch-size": "2", "page": "p1"})[1])["view"]
    assert new > other
    search = {"model": "llama-2-7b", "precision": "bf16-true", "optim": "adamw_torch", "gpus": "a100-80gb",
              "objective": "gpus", "top": "1", "max-gpus": "1"}
    for path, query in [("/api/prices", q), ("/api/largest", q), ("/api/recommend", {**q, "max": "micro-batch"}),
                        ("/api/recommend", search)]:
        status, body, _ = get(served, path, {**query, "page": "p1", "view": str(old)})
        assert status == 409 and "newer view" in json.loads(body)["error"], (path, body)
    assert get(served, "/api/largest", {**q, "page": "p1", "view": str(new)})[1] == get(served, "/api/largest", q)[1]
    status, body, _ = get(served, "/api/prices", {**q, "page": "p1", "view": str(new)})
    assert status == 200 and json.loads(body)["a100-80gb"]["provider"]
    status, body, _ = get(served, "/api/prices", {**q, "page": "p1", "view": "x1"})
    assert status == 400 and json.loads(body)["error"].startswith("view must be a view's number")
    status, body, _ = get(served, "/api/view", {**q, "page": "../x"})
    assert status == 400 and json.loads(body)["error"].startswith("page must be a page's id")


def test_the_view_may_leave_the_advice_and_the_gpus_for_later(served):
    """``/api/view?...&advice=later&gpus=later`` (the page's): the estimate is ``/api/estimate``'s with ``advice``
    null, and ``/api/advice`` gives that advice: together they are the CLI's report; ``gpus`` is null, and
    ``/api/gpus`` gives what the whole view has there. A scenario that does not fit (a 7B model, full fine-tuning
    in bf16-mixed with AdamW, micro-batch 6 of 4096 tokens on an 80 GB GPU) so that the advice is not empty;
    ``/api/advice`` and ``/api/gpus`` for an older view of the page are 409, any other value of either 400."""
    q = {"model": "llama-2-7b", "gpu": "a100-80gb", "precision": "bf16-mixed", "optim": "adamw_torch",
         "per-device-train-batch-size": "6", "max-seq-length": "4096", "gradient-checkpointing": "true"}
    whole = json.loads(run_cli("estimate", *flags(q), "--format", "json").stdout)
    assert whole["advice"] and whole["memory"]["fits"] is False
    view = json.loads(get(served, "/api/view", {**q, "page": "adv", "advice": "later", "gpus": "later"})[1])
    assert view["estimate"]["advice"] is None and view["gpus"] is None
    assert {**view["estimate"], "advice": whole["advice"]} == whole
    mine = {**q, "page": "adv", "view": str(view["view"])}
    status, body, _ = get(served, "/api/advice", mine)
    assert status == 200 and json.loads(body) == {"advice": whole["advice"]}
    status, body, _ = get(served, "/api/gpus", mine)
    full = json.loads(get(served, "/api/view", q)[1])
    assert full["estimate"] == whole  # without advice=later: all of it
    assert status == 200 and json.loads(body) == full["gpus"] and len(full["gpus"]) > 10
    get(served, "/api/view", {**q, "page": "adv", "per-device-train-batch-size": "7"})  # the page moves on
    for path in ("/api/advice", "/api/gpus"):
        status, body, _ = get(served, path, mine)
        assert status == 409 and "newer view" in json.loads(body)["error"], path
    for name in ("advice", "gpus"):
        status, body, _ = get(served, "/api/view", {**q, name: "now"})
        assert status == 400 and json.loads(body)["error"].startswith(f"{name} must be 'later'")


def test_a_search_may_wait_for_the_running_one(served):
    """``wait=SECONDS``: a number within the server's search limit; a request waits that long for the search
    slot, then 429, and gives up at once (429) when a newer request starts waiting (the page's abandoned one)."""
    import threading
    import time

    from fitplan.web import api

    base = [("model", "llama-2-7b"), ("objective", "gpus"), ("gpus", "h100-sxm"), ("top", "1")]
    for bad in ("-1", "61", "nan", "soon"):
        status, body, _ = get(served, "/api/recommend", [*base, ("wait", bad)])
        assert status == 400 and "wait must be" in json.loads(body)["error"], (bad, body)
    settings = api.Settings(search_seconds=30.0)
    settings.search_lock.acquire()  # a search is running
    t0 = time.monotonic()
    assert api.answer(api.recommend, settings, [*base, ("wait", "0.5")]).status == 429
    assert time.monotonic() - t0 >= 0.5
    replies = {}
    older = threading.Thread(target=lambda: replies.setdefault("older", api.answer(
        api.recommend, settings, [*base, ("wait", "20")])))
    older.start()
    time.sleep(0.3)
    newer = threading.Thread(target=lambda: replies.setdefault("newer", api.answer(
        api.recommend, settings, [*base, ("wait", "20")])))
    newer.start()
    older.join(timeout=5)
    assert not older.is_alive() and replies["older"].status == 429  # gave up long before its 20 s
    settings.search_lock.release()  # the running search ends: the newest waiter searches
    newer.join(timeout=60)
    assert replies["newer"].status == 200 and json.loads(replies["newer"].body)["plans"]
    assert settings.search_lock.acquire(blocking=False)  # and released the slot
    settings.uploads.close()


# --------------------------------------------------------------------------- a safe local server


def test_only_requests_addressed_to_the_server_are_answered(served):
    path = "/api/estimate?model=llama-2-7b"
    assert raw(served, "GET", path, headers={"Host": f"127.0.0.1:{served.port}"})[0] == 200
    assert raw(served, "GET", path, headers={"Host": f"localhost:{served.port}"})[0] == 200
    for host in (f"evil.example:{served.port}", "127.0.0.1", f"127.0.0.1:{served.port + 1}", f"127.0.0.1.nip.io:{served.port}"):
        status, body = raw(served, "GET", path, headers={"Host": host})
        assert status == 403 and "answers only requests addressed to" in json.loads(body)["error"]
    assert raw(served, "GET", path, headers={})[0] in (400, 403)  # no Host header at all (h11 refuses it first)


def test_uploads_check_origin_type_and_size(served):
    data = TINY.read_bytes()
    host = {"Host": f"127.0.0.1:{served.port}", "Content-Type": "application/json"}
    assert raw(served, "POST", "/api/upload", data, {**host, "Origin": "http://evil.example"})[0] == 403
    assert raw(served, "POST", "/api/upload", data, {**host, "Origin": "null"})[0] == 403
    assert raw(served, "POST", "/api/upload", data, {**host, "Sec-Fetch-Site": "cross-site"})[0] == 403
    assert raw(served, "POST", "/api/upload", data, {**host, "Content-Type": "text/plain"})[0] == 415
    assert raw(served, "POST", "/api/upload", b"{" * (2 << 20), host)[0] == 413
    assert raw(served, "POST", "/api/upload", b"{not json", host)[0] == 400
    assert raw(served, "POST", "/api/upload", data, {**host, "Origin": f"http://127.0.0.1:{served.port}"})[0] == 200
    assert raw(served, "POST", "/api/upload", data, host)[0] == 200  # a non-browser client sends no Origin
    assert raw(served, "DELETE", "/api/upload", None, host)[0] == 405


def test_replies_carry_a_strict_content_security_policy(served):
    for path in ("/", "/static/app.js", "/api/models"):
        _, _, headers = get(served, path)
        assert "default-src 'none'" in headers["content-security-policy"] and headers["x-content-type-options"] == "nosniff"
    status, body, _ = get(served, "/api/nothing")
    assert status == 404 and "error" in json.loads(body)


def test_the_estimate_csv_is_a_download_of_the_estimates_figures(served):
    """``/api/estimate.csv``: the rows at the peak add up to the peak and to the API's; the device total, usable
    memory and fits are the API's; no time or cost without a dataset size; bad input is the CLI's 400."""
    import csv

    query = {"model": "llama-2-7b", "gpu": "l4", "method": "qlora", "optim": "adamw_torch", "precision": "bf16-mixed"}
    status, body, headers = get(served, "/api/estimate.csv", query)
    assert status == 200 and headers["content-type"].startswith("text/csv")
    assert headers["content-disposition"] == 'attachment; filename="fitplan-estimate.csv"'
    rows = list(csv.DictReader(body.decode().splitlines()))
    memory = json.loads(get(served, "/api/estimate", query)[1])["memory"]
    value = {(r["section"], r["name"]): r["value"] for r in rows}
    assert sum(int(r["value"]) for r in rows if r["section"] == "peak") == int(value["memory", "peak"]) == \
        memory["per_gpu_bytes"]["peak"]
    assert int(value["memory", "device_total"]) == memory["per_gpu_bytes"]["device_total"]
    assert int(value["memory", "usable"]) == memory["usable_bytes"]
    assert value["memory", "fits"] == str(memory["fits"]).lower()
    assert value["time", "seconds"] == ""  # no dataset size: no time, nothing priced
    assert not [r for r in rows if r["section"] in ("cost", "provider")]
    status, body, _ = get(served, "/api/estimate.csv", {"model": "llama-2-13"})
    assert status == 400 and "llama-2-13" in json.loads(body)["error"]


def test_the_page_needs_no_network(served):
    """Every asset is bundled: the page names no other host (no CDN, no web font)."""
    for path in ("/", "/static/app.js", "/static/view.js", "/static/cheapest.js", "/static/compare.js", "/static/app.css"):
        text = get(served, path)[1].decode()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text
        assert not re.search(r"""(src|href)\s*=\s*["']?//|url\(\s*["']?//|@import""", text)  # protocol-relative


def cache_config(cache, repo: str, commit: str = "0" * 40) -> None:
    """Lay ``TINY`` out as ``huggingface_hub`` caches ``repo``'s config.json (``refs/main`` -> the commit,
    ``snapshots/<commit>/config.json``; huggingface_hub's ``file_download.py``)."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    (folder / "snapshots" / commit / "config.json").write_bytes(TINY.read_bytes())


def test_a_hub_id_is_read_from_the_local_cache_only(served, tmp_path, monkeypatch):
    """A query never makes the server download (docs/serve.md, "Security"): a Hub id that is not cached is a 400
    naming it (and ``download``, for the page's button), with no call to huggingface_hub; a cached one is
    estimated; ``POST /api/hub-download`` is the explicit download, refused cross-site."""
    import huggingface_hub

    calls = []

    def fake_download(repo_id, filename, revision=None, **kw):
        calls.append((repo_id, filename, revision))
        cache_config(tmp_path, repo_id)
        return str(tmp_path / ("models--" + repo_id.replace("/", "--")) / "snapshots" / ("0" * 40) / filename)

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    q = {"model": "some-org/tiny-model", "gpu": "t4"}
    for endpoint in ("/api/view", "/api/estimate", "/api/explain?quantity=peak&x=", "/api/gpus"):
        path, _, extra = endpoint.partition("?")
        query = [*q.items(), *[kv for kv in urllib.parse.parse_qsl(extra) if kv[0] != "x"]]
        status, body, _ = get(served, path, query)
        reply = json.loads(body)
        assert status == 400 and reply["download"] == "some-org/tiny-model", (endpoint, reply)
        assert "not in the local Hugging Face cache" in reply["error"] and "--allow-hub" in reply["error"]
    assert calls == []
    host = {"Host": f"127.0.0.1:{served.port}", "Content-Type": "application/json"}
    body = json.dumps({"model": "some-org/tiny-model"}).encode()
    assert raw(served, "POST", "/api/hub-download", body, {**host, "Origin": "http://evil.example"})[0] == 403
    assert raw(served, "POST", "/api/hub-download", body, {**host, "Content-Type": "text/plain"})[0] == 415
    assert raw(served, "POST", "/api/hub-download", b'{"model": "../x"}', host)[0] == 400
    assert calls == []
    status, reply = raw(served, "POST", "/api/hub-download", body, {**host, "Origin": f"http://127.0.0.1:{served.port}"})
    assert status == 200 and calls == [("some-org/tiny-model", "config.json", "main")], reply
    status, body, _ = get(served, "/api/estimate", q)
    assert status == 200 and json.loads(body)["model"]["param_count"] > 0
    assert len(calls) == 1  # the estimate read the cache


@pytest.fixture
def limited():
    """A second server with a 1 s request-read timeout and at most 3 open connections."""
    import threading
    import time

    from fitplan.web.api import Settings
    from fitplan.web.server import make_server

    settings = Settings()
    server, sock, url = make_server(settings, "127.0.0.1", 0, read_timeout=1.0, max_connections=3)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.02)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(timeout=10)
    settings.uploads.close()


def partial(port: int, data: bytes = b"GET / HTTP/1.1\r\nHost: 127.0.") -> "socket.socket":
    import socket

    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(data)
    return s


def test_a_partial_request_is_closed_after_the_read_timeout(limited):
    import time

    for data in (b"GET / HTTP/1.1\r\nHost: 127.0.", b"", b"POST /api/upload HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{" % limited):
        s = partial(limited, data)
        t0 = time.monotonic()
        got = s.recv(1024)  # b"": the server closed the connection
        elapsed = time.monotonic() - t0
        s.close()
        assert got == b"" and 0.8 < elapsed < 3.0, (data, got, elapsed)
    ok = partial(limited, b"GET /favicon.ico HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % limited)
    assert ok.recv(1024).startswith(b"HTTP/1.1 204")  # a whole request is answered
    ok.close()


def test_open_connections_are_capped(limited):
    import time

    held = [partial(limited, b"") for _ in range(3)]
    time.sleep(0.3)  # accepted by the server
    extra = partial(limited, b"GET /favicon.ico HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % limited)
    assert extra.recv(1024).startswith(b"HTTP/1.1 503")
    extra.close()
    for s in held:
        s.close()
    time.sleep(0.3)
    again = partial(limited, b"GET /favicon.ico HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % limited)
    assert again.recv(1024).startswith(b"HTTP/1.1 204")
    again.close()


# --------------------------------------------------------------------------- uploads and exports, read back


def test_an_uploaded_config_gives_the_numbers_of_the_same_file_on_the_cli(served):
    status, body = raw(served, "POST", "/api/upload?filename=config.json", TINY.read_bytes(),
                       {"Host": f"127.0.0.1:{served.port}", "Content-Type": "application/json"})
    up = json.loads(body)
    assert status == 200 and up["model"].startswith("upload:") and up["name"] == "llama"  # no _name_or_path: its model_type
    q = {"model": up["model"], "gpu": "t4", "per-device-train-batch-size": "2", "max-seq-length": "256"}
    api = json.loads(get(served, "/api/estimate", q)[1])
    cli = json.loads(cli_output("estimate", *flags({**q, "model": str(TINY)}), "--format", "json"))
    assert api["memory"] == cli["memory"] and api["model"]["param_count"] == cli["model"]["param_count"]
    status, body, _ = get(served, "/api/estimate", {"model": "upload:0123456789abcdef"})
    assert status == 400 and "drop the config.json" in json.loads(body)["error"]


@pytest.mark.parametrize("kind, flag", [("scenario", None), ("deepspeed", "--deepspeed"), ("training-args", "--training-args")])
def test_exports_read_back_give_the_same_estimate(served, tmp_path, kind, flag):
    q = {"model": "llama-2-7b", "gpu": "h100-sxm", "num-gpus": "4", "zero": "2", "precision": "bf16-master",
         "per-device-train-batch-size": "2", "gradient-checkpointing": "true"}
    for k in ({kind, "deepspeed"} if kind == "training-args" else {kind}):  # TrainingArguments names ds_config.json
        status, body, headers = get(served, "/api/export", {**q, "kind": k})
        assert status == 200 and "attachment" in headers["content-disposition"]
        path = tmp_path / headers["content-disposition"].split('filename="')[1].rstrip('"')
        path.write_bytes(body)
        if k == kind:
            mine = path
    if flag is None:
        back = cli_output("estimate", str(mine), "--format", "json")
    else:  # these formats carry the training settings, not the model, GPU, GPU count or checkpointing (the notes)
        back = cli_output("estimate", flag, str(mine), "--model", "llama-2-7b", "--gpu", "h100-sxm", "--num-gpus", "4",
                          "--gradient-checkpointing", "--format", "json")
    api = json.loads(get(served, "/api/estimate", q)[1])
    assert json.loads(back)["memory"] == api["memory"]


def test_the_view_is_the_estimate_and_its_variants(served):
    """/api/view's parts (and /api/largest) are estimates of variants: each equals /api/estimate with that one flag
    changed."""
    q = {"model": "llama-2-7b", "gpu": "a100-80gb", "precision": "bf16-true", "gradient-checkpointing": "true",
         "num-examples": "10000", "tokens-per-example": "512"}
    view = json.loads(get(served, "/api/view", q)[1])
    assert view["estimate"] == json.loads(get(served, "/api/estimate", q)[1])
    gpus = {r["id"]: r for r in view["gpus"]}
    assert gpus["a100-80gb"]["memory"] == view["estimate"]["memory"]
    lambda_row = next(p for p in view["providers"] if p["id"] == "lambda")
    priced = json.loads(get(served, "/api/estimate", {**q, "provider": "lambda"})[1])
    assert lambda_row["cost"] == priced["cost"] and lambda_row["time"] == priced["time"]
    largest = json.loads(get(served, "/api/largest", q)[1])
    assert largest["micro-batch"]["headroom"] == "0" and largest["seq-length"]["gpu"] == "a100-80gb"
    n = largest["micro-batch"]["largest"]
    at = lambda b: json.loads(get(served, "/api/estimate", {**q, "per-device-train-batch-size": str(b)})[1])["memory"]["fits"]
    assert n >= 1 and at(n) is True and at(n + 1) is False  # the boundary of the fits verdict
    # bf16-true on one GPU: no DeepSpeed file; the SkyPilot task is written from the estimate (on demand)
    assert {k["kind"] for k in view["exports"]["kinds"] if "error" not in k} == {"accelerate", "training-args",
                                                                                 "skypilot", "scenario"}


# --------------------------------------------------------------------------- the extra stays optional


def test_serve_without_the_web_extra_says_what_to_install(monkeypatch, capsys):
    import importlib.util

    from fitplan.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "starlette" else real(name, *a))
    with pytest.raises(SystemExit) as exit_info:
        main(["serve"])
    assert exit_info.value.code == 2
    assert "pip install 'fitplan[web]'" in capsys.readouterr().err


def test_the_core_and_the_api_modules_import_no_web_framework():
    import subprocess
    import sys

    code = ("import sys; from fitplan.cli import main; main(['estimate', '--model', 'llama-2-7b', '--format', 'json']);"
            "import fitplan.web.api, fitplan.web.view; "
            "assert not {'starlette', 'uvicorn'} & set(sys.modules), sorted({'starlette', 'uvicorn'} & set(sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_fitplan_serve_serves_the_page_and_stops_on_ctrl_c(tmp_path, signame):
    """The command itself: it prints its address, serves the page, and stops cleanly on SIGINT (Ctrl+C) and on
    SIGTERM, removing its uploads' directory."""
    import os
    import re as re_
    import signal
    import subprocess
    import sys

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "fitplan", "serve", "--port", "0"], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        line = proc.stderr.readline()
        url = re_.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        with urllib.request.urlopen(url, timeout=30) as r:
            assert b"<title>fitplan</title>" in r.read()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("fitplan-serve-")]
    finally:
        proc.send_signal(getattr(signal, signame))
        proc.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr.read()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("fitplan-serve-")]
