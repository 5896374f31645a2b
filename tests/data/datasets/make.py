"""Writes the small datasets of tests/test_dataset_*.py (committed; run again only to change them):
the same twelve texts as JSON Lines, CSV and Parquet, chat conversations (JSONL, a JSON array, ShareGPT-style
``conversations``) and prompt-completion pairs. ``python tests/data/datasets/make.py``"""

import csv
import json
from pathlib import Path

HERE = Path(__file__).parent

TEXTS = [
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun.",
    "Fine-tuning a language model needs data, a GPU and patience.",
    "Hello, world!",
    "Tokens are pieces of words; a long word such as internationalization splits into several of them.",
    "Short.",
    "Packing concatenates examples so that no position of a micro-batch is wasted on padding tokens, "
    "while padding to the longest example of each batch wastes the difference between that example and the others.",
    "Line one,\nline two with a comma, and \"quotes\".",
    "Numbers like 12345 and 3.14159 tokenize differently from words.",
    "Ünïcödé text: naïve café, Grüße, 東京.",
    "The dog ran.",
    "A dataset of examples with very different lengths pads a lot when batches are drawn at random, "
    "and much less when examples of similar length are grouped together in the same micro-batch; "
    "that is what group_by_length does, at the price of a less random order.",
]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "Paris."}],
    [{"role": "system", "content": "You answer briefly."},
     {"role": "user", "content": "How many legs does a spider have?"},
     {"role": "assistant", "content": "Eight."}],
    [{"role": "user", "content": "Tell me a short story about a cat."},
     {"role": "assistant", "content": "The cat sat on the mat, and the mat was warm, so the cat stayed."},
     {"role": "user", "content": "And then?"},
     {"role": "assistant", "content": "Then the dog ran in, and the cat left."}],
    [{"role": "user", "content": "Translate 'hello' into German."},
     {"role": "assistant", "content": "Hallo."}],
    [{"role": "user", "content": "  Spaces around  "},
     {"role": "assistant", "content": "are trimmed by the template.", "tool_calls": None}],
    [{"role": "user", "content": "Explain padding in one sentence."},
     {"role": "assistant", "content": "Padding fills the shorter sequences of a batch up to the longest one, "
                                      "and the GPU computes those positions for nothing."}],
]

PAIRS = [
    {"prompt": "The capital of France is", "completion": " Paris."},
    {"prompt": "Two plus two equals", "completion": " four."},
    {"prompt": "A long prompt that goes on and on about the weather, the sea, the mountains and the sky, "
               "before finally asking: what colour is the sky?", "completion": " Blue."},
    {"prompt": "Hello", "completion": ", world!"},
]


def main() -> None:
    with open(HERE / "text.jsonl", "w", encoding="utf-8") as f:
        for t in TEXTS:
            f.write(json.dumps({"text": t, "id": len(t)}, ensure_ascii=False) + "\n")
    with open(HERE / "text.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "text"])
        for t in TEXTS:
            w.writerow([len(t), t])
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": TEXTS, "id": [len(t) for t in TEXTS]}), HERE / "text.parquet", row_group_size=5)
    with open(HERE / "chat.jsonl", "w", encoding="utf-8") as f:
        for m in CHATS:
            f.write(json.dumps({"messages": m}) + "\n")
    (HERE / "chat.json").write_text(json.dumps([{"messages": m} for m in CHATS], indent=2) + "\n", encoding="utf-8")
    with open(HERE / "sharegpt.jsonl", "w", encoding="utf-8") as f:
        for m in CHATS[:3]:
            conv = [{"from": x["role"], "value": x["content"]} for x in m]
            f.write(json.dumps({"conversations": conv}) + "\n")
    with open(HERE / "prompt_completion.jsonl", "w", encoding="utf-8") as f:
        for p in PAIRS:
            f.write(json.dumps(p) + "\n")


if __name__ == "__main__":
    main()
