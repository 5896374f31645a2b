"""How fast and how lean is the dataset reader? Prints tokens per second and peak memory.

1. **Throughput** (goal: at least 1M tokens/s on one core for plain text, through the fast tokenizer's batch
   API). A byte-level BPE tokenizer of 32,000 tokens is trained here on the docstrings of Python's standard
   library (English prose, no download); a JSON Lines file of those texts is written to a temporary directory.
   Measured, each in its own process: the tokenizer's batch API alone on one thread (``RAYON_NUM_THREADS=1``),
   the whole ``fitplan dataset`` pass on one core (read, parse, append EOS, tokenize), and the pass on every
   core (worker processes).
2. **Memory** (goal: a 2 GB file streams under 500 MB): ``--big GB`` writes a JSON Lines file of that size to
   /tmp and runs ``fitplan dataset`` on it (``--sample N`` to tokenize only a sample: the file is still hashed,
   counted and scanned whole), printing the peak resident memory of the process tree (sampled from /proc every
   0.1 s) and of the largest process. The file is removed afterwards.

    .venv/bin/python bench/bench_dataset.py                 # throughput, ~1-2 minutes
    .venv/bin/python bench/bench_dataset.py --big 2         # + 2 GB, all of it tokenized (long)
    .venv/bin/python bench/bench_dataset.py --big 2 --sample 20000
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import pkgutil
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

GOAL_TOKENS_PER_S = 1_000_000
GOAL_RSS_MB = 500


def docstrings() -> list[str]:
    """Paragraphs of the standard library's docstrings."""
    import importlib
    import warnings

    out: list[str] = []
    warnings.simplefilter("ignore")
    for m in sorted(pkgutil.iter_modules(), key=lambda m: m.name):
        if m.name.startswith("_") or m.name in ("antigravity", "this", "idlelib", "tkinter", "turtle") or "test" in m.name:
            continue
        try:
            mod = importlib.import_module(m.name)
        except BaseException:  # noqa: BLE001 - some modules refuse to import here
            continue
        for _, obj in inspect.getmembers(mod):
            doc = inspect.getdoc(obj) if (inspect.isfunction(obj) or inspect.isclass(obj)) else None
            if doc:
                out += [p.replace("\n", " ") for p in doc.split("\n\n") if len(p) > 40]
    return list(dict.fromkeys(out))


def build(workdir: Path) -> tuple[Path, Path]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    texts = docstrings()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=32000, special_tokens=["<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tdir = workdir / "tokenizer"
    tdir.mkdir()
    tok.save(str(tdir / "tokenizer.json"))
    (tdir / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    data = workdir / "text.jsonl"
    rng = random.Random(0)
    with open(data, "w", encoding="utf-8") as f:
        for _ in range(5):  # about 39 MB: over scan.PARALLEL_BYTES, so the last run uses worker processes
            rng.shuffle(texts)
            for t in texts:
                f.write(json.dumps({"text": t}) + "\n")
    return tdir, data


RAW = """
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
texts = [json.loads(l)["text"] + "</s>" for l in open(sys.argv[2], encoding="utf-8")]
t0, c0 = time.perf_counter(), time.process_time()
n = 0
for i in range(0, len(texts), 1000):
    n += sum(len(e) for e in tok.encode_batch_fast(texts[i:i + 1000]))
print(json.dumps({"tokens": n, "wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}))
"""

PIPELINE = """
import json, sys, time
from fitplan.data.resolve import Request, make
t0, c0 = time.perf_counter(), time.process_time()
s = make(Request(sys.argv[2], tokenizer=sys.argv[1], jobs=int(sys.argv[3]), use_cache=False))
print(json.dumps({"tokens": s.lengths.total, "wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}))
"""


def run(code: str, *args: str, one_thread: bool) -> dict:
    env = {**os.environ, **({"RAYON_NUM_THREADS": "1"} if one_thread else {})}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout)


def throughput(workdir: Path) -> None:
    t0 = time.perf_counter()
    tdir, data = build(workdir)
    print(f"tokenizer trained and {data.stat().st_size / 1e6:.1f} MB of text written in {time.perf_counter() - t0:.0f} s")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rows = [("tokenizer batch API, 1 thread", run(RAW, str(tdir / "tokenizer.json"), str(data), one_thread=True)),
            ("fitplan dataset pass, 1 core", run(PIPELINE, str(tdir), str(data), "1", one_thread=True)),
            (f"fitplan dataset pass, {cores} cores", run(PIPELINE, str(tdir), str(data), str(cores), one_thread=False))]
    mb = data.stat().st_size / 1e6
    for i, (label, r) in enumerate(rows):
        rate = r["tokens"] / r["wall"]
        cpu = f", {r['tokens'] / max(r['cpu'], 1e-9) / 1e6:5.2f} M tokens per CPU-second" if i < 2 else ""
        print(f"{label:38s} {rate / 1e6:6.2f} M tokens/s wall ({mb / r['wall']:5.1f} MB/s){cpu}; "
              f"goal ratio {GOAL_TOKENS_PER_S / rate:.2f} (< 1 meets {GOAL_TOKENS_PER_S / 1e6:g}M/s)")
    print(f"({rows[0][1]['tokens']:,} tokens; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")


# --------------------------------------------------------------------------- memory


def tree_rss(pid: int) -> tuple[int, int]:
    """(sum, largest) resident bytes of ``pid`` and its descendants."""
    pids, seen = [pid], []
    while pids:
        p = pids.pop()
        seen.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                pids += [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
        except OSError:
            pass
    sizes = []
    for p in seen:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    sizes.append(int(line.split()[1]) * 1024)
        except OSError:
            pass
    return sum(sizes), max(sizes, default=0)


def big_file(path: Path, gb: float) -> None:
    rng = random.Random(1)
    texts = docstrings()
    target = int(gb * 1e9)
    with open(path, "w", encoding="utf-8") as f:
        written = 0
        while written < target:
            line = json.dumps({"text": " ".join(rng.choice(texts) for _ in range(rng.randint(1, 6)))}) + "\n"
            f.write(line)
            written += len(line)


def memory(workdir: Path, gb: float, sample: int | None) -> None:
    tdir, _ = build(workdir) if not (workdir / "tokenizer").exists() else (workdir / "tokenizer", None)
    path = Path(tempfile.gettempdir()) / f"fitplan-bench-{gb:g}GB.jsonl"
    t0 = time.perf_counter()
    big_file(path, gb)
    print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s")
    cmd = [sys.executable, "-m", "fitplan", "dataset", str(path), "--tokenizer", str(tdir), "--no-cache", "--format", "json"]
    if sample:
        cmd += ["--sample", str(sample)]
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        peak = [0, 0]

        def poll() -> None:
            while proc.poll() is None:
                total, largest = tree_rss(proc.pid)
                peak[0], peak[1] = max(peak[0], total), max(peak[1], largest)
                time.sleep(0.1)

        watcher = threading.Thread(target=poll)
        watcher.start()
        out, err = proc.communicate()
        watcher.join()
        wall = time.perf_counter() - t0
        if proc.returncode:
            raise SystemExit(err)
        r = json.loads(out)
        print(f"fitplan dataset{' --sample ' + str(sample) if sample else ''}: {r['examples']:,} examples, "
              f"{r['tokens']['total']:,.0f} tokens in {wall:.0f} s; peak RSS {peak[0] / 1e6:.0f} MB for the process tree, "
              f"{peak[1] / 1e6:.0f} MB for the largest process (goal < {GOAL_RSS_MB} MB)")
    finally:
        path.unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--big", type=float, default=0, help="also stream a JSON Lines file of this many GB")
    ap.add_argument("--sample", type=int, default=None, help="with --big: tokenize only a sample of N examples")
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        if not args.skip_throughput:
            throughput(Path(d))
        if args.big:
            memory(Path(d), args.big, args.sample)


if __name__ == "__main__":
    main()
