"""The one place where tests build a scheduler and its requests without a model (adapt here when constructors move).

sched = make_scheduler(num_blocks=5, block_size=4, max_num_seqs=2, max_num_batched_tokens=64)
sched.add(make_request(0, range(8), block_size=4))
out = run_step(sched)             # schedule, sample token 7 for every request that samples, postprocess
"""

from minipic_lite.block_pool import BlockPool
from minipic_lite.chunks import SchedulerOutput
from minipic_lite.config import SchedulerConfig
from minipic_lite.hashing import root_hash
from minipic_lite.kv_cache_manager import KVCacheManager
from minipic_lite.request import Request
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.scheduler import Scheduler

ROOT = root_hash("tests.sched_factory")


def make_scheduler(
    num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int = 1024
) -> Scheduler:
    """A scheduler over a fresh pool of `num_blocks` blocks (prefix caching on, one decode step per visit).

    `block_size` is the requests' (make_request's); the pool itself does not need it today."""
    del block_size
    return Scheduler(SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len), KVCacheManager(num_blocks))


def make_request(request_id: int, token_ids, block_size: int, max_tokens: int = 64) -> Request:
    return Request(request_id, list(token_ids), SamplingParams(max_tokens=max_tokens), block_size, ROOT)


def pool_of(sched: Scheduler) -> BlockPool:
    return sched.kv.pool


def run_step(sched: Scheduler, token_id: int = 7) -> SchedulerOutput:
    """One step as the engine runs it, with `token_id` sampled for every request whose chunk ends its tokens."""
    out = sched.schedule()
    sched.postprocess(out, [[token_id] if s.do_sample else [] for s in out.scheduled], lambda seq: False)
    pool_of(sched).check_integrity()
    return out


def finish(sched: Scheduler, request: Request) -> None:
    sched.finish(request, "stop")
    pool_of(sched).check_integrity()
