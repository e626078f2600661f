"""Where a cached prompt's TTFT through `generate` goes beyond the engine's own step: the hand-off to the loop thread.

The heaviest cached row of the TTFT grid (8 documents of 2,048 tokens cached as spans, a new question each time, two
tokens generated so the first one comes before the request's end), through `LLM.generate`, with the loop thread's
moments recorded on the loop thread itself (its `engine.add` and the step's `schedule()`):

    arrival -> add       the request's hashes in the caller, its trip through the inbox, the loop thread waking
    add -> schedule      the loop thread's own bookkeeping before the step
    schedule -> first    the step: schedule, prepare, forward, the token back (what `host_ttft` times directly)

in ways taken in turn (`--ways`): the loop thread blocking on its inbox (`blocking`, the engine's), polling it every
`--tick-us` for `--window-ms` after each call (`polling`, an experiment made here by wrapping the inbox: a thread that
sleeps long enough may find its core in a deep idle state, and waking it costs what the wrap would save), and the
same question driven directly on the loop thread (`direct`: one `call` that builds the request as `generate` does,
adds it and steps the engine; no hand-off), so that what the hand-off costs is read in one process.

    python bench/loop_handoff.py --device cuda --llama3-8b-shape        # the H200 (results: bench/results)
    python bench/loop_handoff.py --doc-tokens 512                       # CPU scale, a tiny random Llama
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import tempfile
import time
from pathlib import Path

import torch
from provenance import git_sha  # bench/provenance.py, beside this file

import minipic_lite as mp

RESULTS = Path(__file__).parent / "results"


class PollingInbox:
    """The loop's inbox, waited on by polling: `get(block=True)` asks every `tick_s` for `window_s`, then blocks."""

    def __init__(self, inbox: queue.SimpleQueue, window_s: float, tick_s: float):
        self.inbox, self.window_s, self.tick_s = inbox, window_s, tick_s

    def put(self, item) -> None:
        self.inbox.put(item)

    def get_nowait(self):
        return self.inbox.get_nowait()

    def empty(self) -> bool:  # NOTE: the loop asks before it blocks (engine_loop._take_inbox)
        return self.inbox.empty()

    def get(self, block: bool = True):
        if not block:
            return self.inbox.get_nowait()
        deadline = time.perf_counter() + self.window_s
        while time.perf_counter() < deadline:
            try:
                return self.inbox.get(timeout=self.tick_s)
            except queue.Empty:
                pass
        return self.inbox.get()


def build(args) -> mp.LLM:
    from host_ttft import TINY_LLAMA  # bench/host_ttft.py, beside this file
    from rag import CONTROL, LLAMA3_8B  # bench/rag.py, beside this file

    model = Path(tempfile.mkdtemp()) / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA3_8B if args.llama3_8b_shape else TINY_LLAMA))
    max_len = 8 * (args.doc_tokens + 2 * args.block_size) + 256
    return mp.LLM(model, device=args.device, max_model_len=max_len, max_num_batched_tokens=max_len,
                  block_size=args.block_size, load_format="dummy", control_tokens=CONTROL)  # fmt: skip


def record_moments(llm: mp.LLM) -> dict:
    """Wrap the engine's add and the scheduler's schedule (called on the loop thread): their first call's time."""
    engine, marks = llm.engine, {}
    add, schedule = engine.add, engine.scheduler.schedule

    def timed_add(req):
        marks.setdefault("add", time.perf_counter())
        return add(req)

    def timed_schedule():
        marks.setdefault("schedule", time.perf_counter())
        return schedule()

    engine.add, engine.scheduler.schedule = timed_add, timed_schedule
    return marks


def questions(llm: mp.LLM, composer, docs, marks: dict, num: int, tag: int) -> list[dict]:
    from ttft_spans import QUESTION, SYSTEM, TWO_TOKENS  # bench/ttft_spans.py, beside this file

    rows = []
    for i in range(num):
        prompt = composer.block_attention(SYSTEM, docs, QUESTION + f" Q{tag}" * (i + 2))
        marks.clear()
        (out,) = llm.generate(prompt, TWO_TOKENS, use_tqdm=False)
        m = out.metrics
        add, schedule = marks["add"], marks["schedule"]
        rows.append({"arrival_to_add": add - m.arrival_time, "add_to_schedule": schedule - add,
                     "schedule_to_first": m.first_token_time - schedule, "ttft": m.ttft})  # fmt: skip
    return rows


def direct_questions(llm: mp.LLM, composer, docs, marks: dict, num: int, tag: int) -> list[dict]:
    """`questions`, each driven on the loop thread in one call: the request built as `generate` builds it, then
    `engine.add` and steps until it finishes (the loop steps only requests with a sink; this one has none)."""
    from ttft_spans import QUESTION, SYSTEM, TWO_TOKENS  # bench/ttft_spans.py, beside this file

    def ask(engine, prompt):
        (req,) = llm.make_requests([prompt], [TWO_TOKENS])
        engine.add(req)
        while not req.is_finished:
            engine.step()
        return req

    rows = []
    for i in range(num):
        prompt = composer.block_attention(SYSTEM, docs, QUESTION + f" Q{tag}" * (i + 2))
        marks.clear()
        req = llm._loop.call(lambda engine, prompt=prompt: ask(engine, prompt))
        add, schedule = marks["add"], marks["schedule"]
        rows.append({"arrival_to_add": add - req.arrival_time, "add_to_schedule": schedule - add,
                     "schedule_to_first": req.first_token_time - schedule,
                     "ttft": req.first_token_time - req.arrival_time})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--llama3-8b-shape", action="store_true", help="random bf16 weights of bench/rag.py's shape")
    parser.add_argument("--doc-tokens", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--questions", type=int, default=9, help="questions per round (the median is reported)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the ways, each in turn")
    parser.add_argument("--window-ms", type=float, default=20.0)
    parser.add_argument("--tick-us", type=float, default=50.0)
    parser.add_argument("--ways", default="blocking,direct", help="of blocking, polling, direct (each round, in turn)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results' folder")
    args = parser.parse_args()
    from ttft_spans import TWO_TOKENS, TokenIdRecipes, random_documents  # bench/ttft_spans.py, beside this file

    llm = build(args)
    composer = TokenIdRecipes(llm)
    docs = random_documents(8, args.doc_tokens)
    llm.generate(composer.span_prompts("block_attention", docs), TWO_TOKENS, use_tqdm=False)  # the documents cached
    marks = record_moments(llm)
    loop, blocking = llm._loop, llm._loop._inbox
    polling = PollingInbox(blocking, args.window_ms / 1e3, args.tick_us / 1e6)
    questions(llm, composer, docs, marks, 3, tag=0)  # warm-up
    ways = args.ways.split(",")
    results = {name: [] for name in ways}
    for r in range(args.rounds):
        for w, name in enumerate(ways):
            tag = 1 + len(ways) * r + w
            if name == "direct":
                results[name] += direct_questions(llm, composer, docs, marks, args.questions, tag)
                continue
            loop._inbox = polling if name == "polling" else blocking  # NOTE: read by the idle loop at each wait
            results[name] += questions(llm, composer, docs, marks, args.questions, tag)
            loop._inbox = blocking
    summary = {name: {k: statistics.median(row[k] for row in rows) for k in rows[0]} for name, rows in results.items()}
    for name, s in summary.items():
        print(f"{name:>9}: " + ", ".join(f"{k} {1e3 * v:.3f} ms" for k, v in s.items()), flush=True)
    save("loop_handoff", args, {"median_s": summary, "runs": results}, f"-b{args.block_size}")
    llm.close()


def save(bench: str, args, result: dict, tag: str = "") -> None:
    """`result` with the run's git SHA, device and arguments to <args.out>/<bench>-<sha>-<device><tag>.json."""
    sha = git_sha()
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"{bench}-{sha}-{args.device.split(':')[0]}{tag}.json"
    out.write_text(json.dumps({"bench": bench, "git_sha": sha, "device": device, "args": vars(args), **result},
                              indent=1, default=str) + "\n")  # fmt: skip
    print(f"saved {out}")


if __name__ == "__main__":
    main()
