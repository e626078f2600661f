"""The scheduler's host-time savings change no decision: match()'s memo across steps (kv_cache_manager.py) and the
lookahead computed once where nothing changed in between (scheduler.py), against the plain versions they replaced,
step by step with exact equality (every scheduled chunk, block table, preemption, burst and host copy)."""

import functools
import random

import pytest

from minipic_lite.chunks import plan_chunk
from minipic_lite.config import ControlTokens, SchedulerConfig
from minipic_lite.hashing import root_hash
from minipic_lite.hit_guard import HitGuard
from minipic_lite.kv_cache_manager import KVCacheManager
from minipic_lite.request import Request, RequestStatus
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.scheduler import Scheduler
from minipic_lite.spans import span_layout

B = 4
S, P, PAD = 1, 2, 3
CONTROL = ControlTokens(ssep_id=S, pdep_id=P, pad_id=PAD)
ROOT = root_hash("test-scheduler-memo")


class PlainKVCacheManager(KVCacheManager):
    """match() without the memo: the pool and `pending` asked again every time."""

    def _match(self, req):
        num_hittable = len(req.block_hashes) if req.is_span_prefill else (len(req.token_ids) - 1) // req.block_size
        if not self.enable_prefix_caching:
            return ["miss"] * num_hittable, [None] * num_hittable
        hashes = req.block_hashes[:num_hittable]
        found = self.pool.peek_many(hashes)
        return self._kinds(hashes, found, req.block_size), found


class PlainScheduler(Scheduler):
    """_schedule_waiting as it was: the lookahead computed before admissions (every policy) and again after (isps
    admitting a prompt that has a seat whole, as the scheduler does)."""

    def _schedule_waiting(self, out, budget):
        policy = self.config.span_policy
        lookahead = self._lookahead() if policy != "inline" else []
        missing = functools.cache(self._missing_spans)
        barrier = policy == "barrier" and (any([missing(req) for req in lookahead]) or bool(self.span_running))
        guard = HitGuard(self.kv, self.waiting)  # span prefills never evict hits of the prompts ahead (hit_guard.py)
        for req in list(self.waiting):
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            if policy == "barrier" and (barrier or missing(req)) and not self._must_go_inline(req, missing(req)):
                continue  # isps admits a prompt that has a seat whole, as inline
            if not self.kv.allocate_prompt(req):
                break
            self.waiting.remove(req)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            ranges, end = plan_chunk(req, budget)
            budget -= self._commit_chunk(req, ranges, end, out)
        ahead = policy == "isps" or (policy == "barrier" and not self.running)
        for req in self._lookahead() if ahead else ():
            budget = self._start_span_prefills(req, missing(req), out, budget, guard)
            if budget <= 0:
                return


def rag_prompts(rng: random.Random, num_prompts: int, num_docs: int) -> list[list[int]]:
    """[lead] [SSEP doc]... [PDEP question]: documents from a small shared pool, so they recur at other offsets,
    sometimes twice in one prompt."""
    docs = [[rng.randrange(10, 60) for _ in range(rng.randrange(3, 14))] for _ in range(3 * num_docs)]
    prompts = []
    for _ in range(num_prompts):
        tokens = [rng.randrange(10, 60) for _ in range(rng.randrange(1, 6))]
        for doc in rng.choices(docs, k=rng.randrange(1, num_docs + 1)):
            tokens += [PAD] * (-len(tokens) % B) + [S] + doc
        prompts.append(tokens + [PAD] * (-len(tokens) % B) + [P] + [rng.randrange(10, 60) for _ in range(3)])
    return prompts


def decisions(out) -> tuple:
    scheduled = [(s.seq.request_id, s.seq.is_span_prefill, s.query_ranges, s.kv_len, s.do_sample, s.seq.block_table[:])
                 for s in out.scheduled]  # fmt: skip
    return scheduled, [r.request_id for r in out.preempted], out.num_steps, out.copies


def replay(sched_cls, kv_cls, prompts, arrivals, max_tokens, config, num_blocks, num_host_blocks):
    """Every step's decisions, requests arriving at their steps; each sampled token is 7, a request stops at its
    max_tokens."""
    sched = sched_cls(config, kv_cls(num_blocks, num_host_blocks=num_host_blocks))
    layouts = [span_layout(p, CONTROL, B) for p in prompts]
    requests = [Request(str(i), list(p), SamplingParams(max_tokens=n), B, ROOT, layout)
                for i, (p, n, layout) in enumerate(zip(prompts, max_tokens, layouts, strict=True))]  # fmt: skip

    def stops(req):
        if req.num_output_tokens >= req.sampling_params.max_tokens:
            sched.finish(req, "length")
        return req.is_finished

    steps, step = [], 0
    while sched.has_unfinished or step <= max(arrivals):
        for req, arrival in zip(requests, arrivals, strict=True):
            if arrival == step:
                sched.add(req)
        out = sched.schedule()
        steps.append(decisions(out))
        sched.postprocess(out, [[7] * out.num_steps if s.do_sample else [] for s in out.scheduled], stops)
        sched.kv.check_integrity()
        step += 1
        assert step < 5000, "requests did not finish"
    return steps


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("policy", ["inline", "isps", "barrier"])
@pytest.mark.parametrize("host", [0, 24], ids=["no_host", "host_tier"])
def test_memo_and_one_lookahead_schedule_exactly_as_the_plain_scheduler(seed, policy, host):
    rng = random.Random(seed)
    prompts = rag_prompts(rng, num_prompts=rng.randrange(8, 20), num_docs=4)
    arrivals = sorted(rng.choice([0, 0, rng.randrange(1, 30)]) for _ in prompts)
    max_tokens = [rng.randrange(1, 10) for _ in prompts]
    longest = max(-(-(len(p) + 10) // B) for p in prompts)
    num_blocks = rng.choice([longest + 2, 2 * longest, 8 * longest])  # tight (preemptions) to roomy
    config = SchedulerConfig(
        rng.choice([2, 4, 8]), rng.choice([8, 24, 64]), 1024, rng.choice([1, 4]), span_policy=policy
    )
    args = (prompts, arrivals, max_tokens, config, num_blocks, host)
    expected = replay(PlainScheduler, PlainKVCacheManager, *args)
    assert replay(Scheduler, KVCacheManager, *args) == expected


def span_request(request_id, token_ids):
    return Request(request_id, token_ids, SamplingParams(), B, ROOT, span_layout(token_ids, CONTROL, B))


def test_the_memo_holds_across_steps_and_drops_an_entry_once_a_hash_of_it_changes():
    kv = KVCacheManager(32)
    doc = [S, 30, 31, 32, 33, 34, 35, 36]
    a = span_request("a", [20, 21, 22, PAD, *doc, P, 60, 61])
    first = kv.match(a)
    assert first == ["miss"] * 3 and a in kv.match_memo
    assert kv.match(a) == first  # from the memo: nothing logged since
    other = Request("o", [40, 41, 42, 43, 44], SamplingParams(), B, ROOT)
    assert kv.allocate_prompt(other)
    kv.publish(other, 4)  # an unrelated hash: the entry holds
    assert kv.match(a) == first and kv.match_memo[a].checked == len(kv.changed)
    b = span_request("b", [25, 26, 27, PAD, *doc, P, 60, 62])
    assert kv.allocate_prompt(b)  # b computes the document: pending for a
    assert kv.match(a) == ["miss", "pending", "pending"]
    kv.publish(b, 12)
    assert kv.match(a) == ["miss", "hit", "hit"]
    kv.free(b)
    kv.check_integrity()


class StartsOver(dict):
    """The memo's dict, counting how often it is emptied."""

    clears = 0

    def clear(self):
        StartsOver.clears += 1
        super().clear()


class SmallLogKVCacheManager(KVCacheManager):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.match_memo = StartsOver()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", ["isps", "barrier"])
def test_the_memo_starting_over_past_its_log_changes_no_decision(seed, policy, monkeypatch):
    """Past MAX_CHANGED_LOG logged hashes every memo entry is dropped and the log emptied (the entries' positions
    in it would be stale); here the log holds 8 hashes, so a run starts over many times, scheduling as before."""
    monkeypatch.setattr("minipic_lite.kv_cache_manager.MAX_CHANGED_LOG", 8)
    rng = random.Random(100 + seed)
    prompts = rag_prompts(rng, num_prompts=12, num_docs=4)
    arrivals = sorted(rng.choice([0, rng.randrange(1, 20)]) for _ in prompts)
    max_tokens = [rng.randrange(1, 8) for _ in prompts]
    longest = max(-(-(len(p) + 8) // B) for p in prompts)
    args = (prompts, arrivals, max_tokens, SchedulerConfig(4, 24, 1024, 1, span_policy=policy), 2 * longest, 0)
    StartsOver.clears = 0
    expected = replay(PlainScheduler, PlainKVCacheManager, *args)
    assert replay(Scheduler, SmallLogKVCacheManager, *args) == expected
    assert StartsOver.clears > 0


def test_a_memo_entry_sees_a_change_logged_after_the_log_started_over(monkeypatch):
    """The log starts over once it passes MAX_CHANGED_LOG, and every entry with it: an entry that outlived it would
    look for changes from its old position in the new log and miss the document another prompt starts computing."""
    monkeypatch.setattr("minipic_lite.kv_cache_manager.MAX_CHANGED_LOG", 12)
    kv = KVCacheManager(32)
    doc = [S, 30, 31, 32, 33, 34, 35, 36]
    a = span_request("a", [20, 21, 22, PAD, *doc, P, 60, 61])
    unrelated = [Request(f"o{i}", [40 + i] * 13, SamplingParams(), B, ROOT) for i in range(2)]
    assert kv.allocate_prompt(unrelated[0])
    kv.publish(unrelated[0], 12)
    assert kv.match(a) == ["miss"] * 3 and kv.match_memo[a].checked == len(kv.changed) > 0
    assert kv.allocate_prompt(unrelated[1])
    kv.publish(unrelated[1], 12)  # the log passes 12: each prompt logs 9 (3 pending, 3 published, 3 done)
    c = span_request("c", [70, 71, 72, PAD, S, 80, 81, 82, P, 60])
    kv.match(c)  # a match that is not in the memo finds the log full: log and memo start over
    assert len(kv.changed) == 0 and a not in kv.match_memo
    b = span_request("b", [25, 26, 27, PAD, *doc, P, 60, 62])
    assert kv.allocate_prompt(b)  # b computes the document: pending for a
    assert kv.match(a) == ["miss", "pending", "pending"]
    for req in (b, *unrelated):
        kv.free(req)
    kv.check_integrity()
