"""Owns every device tensor: the weights, the paged KV cache, per-step inputs, CUDA graphs and sampling.

It receives the scheduler's host-side plan (`SchedulerOutput`) and returns one token per sampling request;
it never touches queues or block ref counts.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import os
from dataclasses import dataclass, field

import torch

from minipic_lite.chunks import SchedulerOutput
from minipic_lite.config import (
    CUDA_GRAPH_BATCH_SIZES,
    CUDA_GRAPH_MAX_TOKENS_PER_SEQ,
    CUDA_GRAPH_TOKEN_SIZES,
    GIB,
    REROTATE_BATCH_BLOCKS,
    EngineConfig,
    ModelConfig,
    cdiv,
)
from minipic_lite.decode_mirror import DecodeMirror
from minipic_lite.kv_cache_manager import Rerotate
from minipic_lite.models.llama import compile_kernel, rope_table
from minipic_lite.models.packed_linear import (
    can_pack,
    can_route,
    decode_routes,
    drop_packed_weights,
    pack_linears,
    read_routes,
    route_for_rows,
    routes_path,
    write_routes,
)
from minipic_lite.models.registry import model_class
from minipic_lite.models.routed_linear import one_row_candidates, route_many_row_linears, route_one_row_linears
from minipic_lite.models.step import HostStep, RecurrentStep, StepInputs, StepMetadata, host_tensor
from minipic_lite.prompt_logprobs import PromptScoring, plan_scoring, score
from minipic_lite.sampler import Sampler, SamplingBatch, token_logprobs
from minipic_lite.state_cache import StateTensors

logger = logging.getLogger(__name__)


def advance_decode_inputs(inputs: StepInputs, sampled: torch.Tensor, block_size: int) -> StepInputs:
    """The next decode step of the same requests, built on the device with no host sync.

    Each request feeds back the token it just sampled (`sampled` [num_seqs]) at the next position; its
    block table already holds the block of that position (the scheduler took a burst's blocks up front).
    A decode token continues its segment, so visible_start stays.
    """
    meta = inputs.meta
    positions = meta.positions + 1  # (num_seqs,)
    blocks = meta.block_tables.gather(1, (positions // block_size)[:, None]).squeeze(1).long()  # (num_seqs,)
    # NOTE: a burst's later steps leave the CPU mirror aside; its next step copies what it missed.
    meta = dataclasses.replace(
        meta,
        positions=positions,
        kv_lens=meta.kv_lens + 1,
        slot_mapping=blocks * block_size + positions % block_size,
        decode_mirror=None,
    )
    return StepInputs(sampled, meta, inputs.logits_indices)


@dataclass(slots=True)
class InFlight:
    """A step (or burst) queued on the device whose sampled tokens the host has not read yet."""

    out: SchedulerOutput
    sampled: torch.Tensor | None = None  # (num_sampling, num_steps) on the host, filled once `ready`; None: no sampling
    ready: torch.cuda.Event | None = None  # CUDA: recorded after the copy to the host
    # what a continuation starts from: the last step's inputs and tokens, its sampling batch, its graph bucket
    inputs: StepInputs | None = None
    last_sampled: torch.Tensor | None = None  # (num_sampling,) on the device
    batch: SamplingBatch | None = None
    shape: tuple[int, int] | None = None
    table_lens: list[int] = field(default_factory=list)  # each request's block table length when it was queued
    # rows asking for logprobs: (num_sampling, num_steps, 2 + 2k) float32 on the host, `sampler.token_logprobs`' rows
    logprobs: torch.Tensor | None = None
    prompt_scoring: PromptScoring | None = None  # the step's prompt logprobs (prompt_logprobs.py), on the host


def allocate_kv_cache(cfg: ModelConfig, num_blocks: int, block_size: int, dtype, device) -> torch.Tensor:
    """The paged cache: [2 (k, v), layers, blocks, block_size, kv_heads, head_dim], zeroed."""
    shape = (2, cfg.num_attention_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
    return torch.zeros(shape, dtype=dtype, device=device)


def rerotate(keys: torch.Tensor, deltas: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Keys rotated at positions p (neox style, first rotary_dim dims) turned to p + delta: R(p + d) = R(d) R(p).

    keys: [N, ..., head_dim], one block's keys a row; deltas: [N] (long), one delta a row."""
    rows = cos_sin[deltas.abs()].float()  # [N, rotary_dim]
    half = rows.shape[1] // 2
    sign = torch.where(deltas >= 0, 1.0, -1.0)[:, None]  # NOTE: cos is even in delta, sin odd
    shape = (len(deltas),) + (1,) * (keys.dim() - 2) + (half,)
    cos, sin = rows[:, :half].reshape(shape), (rows[:, half:] * sign).reshape(shape)
    x = keys.float()
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    turned = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., 2 * half :]], dim=-1)
    return turned.to(keys.dtype)


def device_longs(values: list[int], device: torch.device) -> torch.Tensor:
    """Host ints as a long tensor on `device` (copied from pinned memory without a sync)."""
    return host_tensor(values, torch.long).to(device, non_blocking=True)


def independent_batches(copies: list[Rerotate], max_blocks: int = REROTATE_BATCH_BLOCKS) -> list[list[Rerotate]]:
    """Consecutive copies cut where one reads a block that an earlier one of its batch writes (a batch reads all its
    sources, then writes all its destinations; a copy is published when its step is scheduled, so a later
    admission of the same step may take it as the source of its own copy), and at `max_blocks` copies a batch."""
    batches, written = [], set()
    for copy in copies:
        if not batches or copy.src in written or len(batches[-1]) == max_blocks:
            batches.append([])
            written = set()
        batches[-1].append(copy)
        written.add(copy.dst)
    return batches


def compiles_kernels(config: EngineConfig) -> bool:
    """torch.compile on CUDA unless `enforce_eager` or `MINIPIC_COMPILE=0`. On the CPU, Inductor's C++ compile
    costs more than it saves for a 135M model on 2 cores, so the CPU path stays eager."""
    return (
        config.device.startswith("cuda") and not config.enforce_eager and os.environ.get("MINIPIC_COMPILE", "1") != "0"
    )


def build_model(config: EngineConfig) -> torch.nn.Module:
    """The model on its device: built on the meta device (no wasted random init), then filled with weights."""
    dtype = getattr(torch, config.dtype)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = model_class(config.model.architecture)(
                config.model, config.cache.position_free, compiles_kernels(config)
            )
    finally:
        torch.set_default_dtype(default_dtype)
    model = model.to_empty(device=config.device)
    model.tie_weights()
    # NOTE: a buffer, not a weight: computed again, in float32, then cast to the model dtype as transformers
    # casts cos/sin before applying them (in bf16 that halves the table bytes the decode kernel reads).
    model.cos_sin = rope_table(config.model, config.device).to(getattr(torch, config.dtype))
    if config.load_format == "dummy":
        model.init_dummy_weights()
    else:
        model.load_weights(config.model_dir)
    return model.eval()


def cpu_available_bytes() -> int:
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    return info.get("MemAvailable", info["MemTotal"])


class ModelRunner:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = getattr(torch, config.dtype)
        self.block_size = config.cache.block_size
        self.model = build_model(config)
        # CPU: decode steps take, per row count, the fastest of F.linear, weights prepacked for oneDNN and the C loop
        # (timed at the first start on a machine, then read back); other steps F.linear (models/packed_linear.py)
        self.decode_routes = {}
        if can_route(self.device, self.dtype):
            routes_file = routes_path(self.model)
            kept = read_routes(routes_file)
            pack = can_pack(self.device, self.dtype) and (kept is None or "packed" in kept.values())
            pack_linears(self.model, pack=pack)
            self.decode_routes = kept or decode_routes(self.model)
            if kept is None:
                write_routes(routes_file, self.decode_routes)
            if "packed" not in self.decode_routes.values():
                drop_packed_weights(self.model)
        # CUDA: one-row steps (batch-1 decode) take Inductor's reduction for the projections where it beats cuBLAS,
        # and the graphs' other row counts cuBLASLt where it does (timed here and below; models/routed_linear.py)
        self.one_row_timings = {}
        if compiles_kernels(config):
            self.one_row_timings = route_one_row_linears(self.model, one_row_candidates(compile_kernel))
        self.state_tensors = None  # hybrid models: live state slots and checkpoints (state_cache.py)
        if config.model.is_hybrid:
            budget, num_slots = config.cache.state_cache_gib * GIB, config.scheduler.max_num_seqs
            self.state_tensors = StateTensors(self.model.state_shapes(), num_slots, budget, self.dtype, self.device)
        self.num_blocks = config.cache.num_blocks or self._num_blocks_from_memory()
        # NOTE: one extra block that the block pool never hands out: CUDA-graph padding rows write there.
        self.scratch_block = self.num_blocks
        cfg = config.model
        self.kv_cache = allocate_kv_cache(cfg, self.num_blocks + 1, self.block_size, self.dtype, self.device)
        self.host_cache = self._allocate_host_tier(config.cache.host_cache_gib)
        self.sampler = Sampler(self.device)
        self.decode_mirror = None
        if self.device.type == "cpu" and config.cache.cpu_decode_mirror:
            mirror_bytes = int(config.cache.cpu_kv_cache_gib * GIB)
            self.decode_mirror = DecodeMirror(cfg, config.cache.position_free, mirror_bytes, self.dtype)
        self.graphs = None
        self.blas_timings = {}
        if self.device.type == "cuda" and not config.enforce_eager and not cfg.is_hybrid:
            from minipic_lite.cuda_graphs import StepGraphs, graph_shapes

            sched = config.scheduler
            token_sizes = tuple(t for t in CUDA_GRAPH_TOKEN_SIZES if t <= sched.max_num_batched_tokens)
            per_seq = CUDA_GRAPH_MAX_TOKENS_PER_SEQ
            shapes = graph_shapes(CUDA_GRAPH_BATCH_SIZES, sched.max_num_seqs, token_sizes, per_seq)
            if compiles_kernels(config):  # each bucket's row counts (its tokens; its sequences at the LM head)
                rows = sorted({n for shape in shapes for n in shape})
                self.blas_timings = route_many_row_linears(self.model, rows)
            self.graphs = StepGraphs(self, shapes)
        if self.device.type == "cuda":
            self._warm_up_attention()

    def _warm_up_attention(self) -> None:
        """Compile every variant of the attention op that this engine's steps may pick, now: an isps step of a shape
        no warm-up had met compiled one (a short read with no split) inside a timed RAG run
        (bench/results/rag-85d064b-cuda-reuse09.log)."""
        from ops.triton_kernel import warm_up

        cfg, sched = self.config.model, self.config.scheduler
        cos_sin = self.model.cos_sin if self.config.cache.position_free else None
        max_context = cdiv(sched.max_model_len, self.block_size) * self.block_size
        warm_up(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, self.block_size, self.dtype, cos_sin, self.device,
                sched.max_num_batched_tokens, max_context, caches=tuple(self.kv_cache[:, 0]))  # fmt: skip

    @property
    def block_bytes(self) -> int:
        cfg = self.config.model
        return 2 * cfg.num_attention_layers * self.block_size * cfg.num_kv_heads * cfg.head_dim * self.dtype.itemsize

    def _allocate_host_tier(self, gib: float) -> torch.Tensor | None:
        """[host blocks, 2, layers, block_size, kv_heads, head_dim] in host memory (pinned on CUDA), or None: a
        block's keys and values of every layer lie together, so moving a block is one contiguous copy."""
        num_host_blocks = int(gib * GIB) // self.block_bytes
        if gib == 0:
            return None
        available = cpu_available_bytes()
        if num_host_blocks == 0 or num_host_blocks * self.block_bytes > 0.9 * available:
            raise ValueError(
                f"host_cache_gib={gib} does not fit: it must hold at least one block ({self.block_bytes} bytes) "
                f"and at most 90% of the host's available memory ({available / GIB:.1f} GiB)"
            )
        shape = (num_host_blocks, *self.kv_cache.shape[:2], *self.kv_cache.shape[3:])
        return torch.zeros(shape, dtype=self.dtype, pin_memory=self.device.type == "cuda")

    @property
    def num_host_blocks(self) -> int:
        return 0 if self.host_cache is None else self.host_cache.shape[0]

    def copy_blocks(self, copies) -> None:
        """Run the step's block copies in order (an eviction before a load that may reuse its block): the host
        tier's, and the copy-rerotate baseline's (kv_cache_manager.Rerotate). Each run of host copies in one
        direction moves together: one gather or scatter on the device, one contiguous copy per block (on CUDA an
        asynchronous DMA from or to pinned memory, ordered on the stream before the forward)."""
        for kind, run in itertools.groupby(copies, key=lambda c: "rerotate" if isinstance(c, Rerotate) else c.to_host):
            run = list(run)
            if kind == "rerotate":
                for batch in independent_batches(run):
                    self._rerotate(batch)
                continue
            block_ids = device_longs([copy.block_id for copy in run], self.device)
            if kind:  # to the host: evictions
                staged = self.kv_cache[:, :, block_ids].movedim(2, 0).contiguous()  # [N, 2, layers, B, H, D]
                for copy, block in zip(run, staged, strict=True):
                    self.host_cache[copy.slot].copy_(block, non_blocking=True)
            else:  # from the host: hits
                staged = torch.empty((len(run), *self.host_cache.shape[1:]), dtype=self.dtype, device=self.device)
                for copy, block in zip(run, staged, strict=True):
                    block.copy_(self.host_cache[copy.slot], non_blocking=True)
                self.kv_cache[:, :, block_ids] = staged.movedim(0, 2)

    def _rerotate(self, copies: list[Rerotate]) -> None:
        """Copy-rerotate's copies as one gather, one rotation and one scatter (not a few kernels a block)."""
        put = functools.partial(device_longs, device=self.device)
        src, dst, deltas = put([c.src for c in copies]), put([c.dst for c in copies]), put([c.delta for c in copies])
        keys, values = self.kv_cache[0], self.kv_cache[1]  # [layers, blocks, B, H, D]
        values[:, dst] = values[:, src]
        keys[:, dst] = rerotate(keys[:, src].movedim(1, 0), deltas, self.model.cos_sin).movedim(0, 1)

    def _num_blocks_from_memory(self) -> int:
        cache = self.config.cache
        if self.device.type == "cuda":
            budget = self._cuda_budget_after_warmup()
        else:
            # NOTE: the CPU cache holds what is asked of it (one full-length request plus one step's budget),
            # not all the memory it could take: a laptop run should not reserve gigabytes it never uses.
            sched = self.config.scheduler
            asked = (cdiv(sched.max_model_len + sched.max_num_batched_tokens, self.block_size) + 1) * self.block_bytes
            budget = min(asked, cache.cpu_kv_cache_gib * GIB, cpu_available_bytes() * cache.memory_utilization)
        num_blocks = int(budget // self.block_bytes) - 1
        if num_blocks <= 0:
            raise ValueError(
                f"no memory is left for the KV cache on {self.device} ({budget / GIB:.2f} GiB after weights and "
                "activations): raise memory_utilization, pass num_blocks, or free memory"
            )
        return num_blocks

    @torch.inference_mode()
    def _cuda_budget_after_warmup(self) -> int:
        """Free memory for the cache, after a forward of a full token budget measured the activation peak."""
        num_tokens = self.config.scheduler.max_num_batched_tokens
        num_blocks = cdiv(num_tokens, self.block_size)
        cache = allocate_kv_cache(self.config.model, num_blocks, self.block_size, self.dtype, self.device)
        torch.cuda.reset_peak_memory_stats()
        meta = StepMetadata.one_sequence(num_tokens, self.block_size, self.device)
        hidden = self.model(torch.zeros(num_tokens, dtype=torch.long, device=self.device), meta, cache)
        self.model.compute_logits(hidden[-1:])
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - cache.numel() * cache.element_size()
        del cache, hidden
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        used_by_others = total - free - torch.cuda.memory_allocated()
        return total * self.config.cache.memory_utilization - used_by_others - peak

    # -- per step ----------------------------------------------------------------------------------------

    @torch.inference_mode()  # NOTE: it also updates the CPU decode mirror, an inference tensor
    def prepare(self, out: SchedulerOutput, shape: tuple[int, int] | None = None) -> StepInputs:
        """Flatten the scheduled chunks into the op's per-token and per-sequence tensors: for a step that replays
        the graph of `shape` (a bucket), straight into that graph's buffers."""
        host = HostStep()
        for s in out.scheduled:
            req, B = s.seq, self.block_size
            host.add_chunk(req.token_ids, req.block_table, s.query_ranges, s.kv_len, req.visible_start, s.do_sample, B)
        if shape is not None:  # NOTE: graphs serve neither hybrids nor the CPU's decode routes and decode mirror
            return self.graphs.static.stage(host, shape)
        meta = StepMetadata.build(host, self.device)
        if out.is_decode_only:
            meta.cpu_matmul = route_for_rows(self.decode_routes, len(host.input_ids))
        if self.state_tensors is not None:
            st = self.state_tensors
            st.before_forward(out.state_ops)  # NOTE: zero / load slots before the forward reads them
            slots = [s.seq.state_slot for s in out.scheduled]
            meta.recurrent = RecurrentStep.build(slots, host.cu_seqlens_q, st.conv, st.ssm)
        if self.decode_mirror is not None and out.is_decode_only:
            meta.decode_mirror = self.decode_mirror.prepare(out, self.kv_cache, self.model.cos_sin, meta.visible_start)
        put = functools.partial(device_longs, device=self.device)
        return StepInputs(put(host.input_ids), meta, put(host.logits_indices))

    def execute(self, out: SchedulerOutput) -> list[list[int]]:
        """Run the step (or burst); return the tokens sampled for each scheduled request, one per step.

        A request that only prefilled this step gets []. A burst (`out.num_steps > 1`, decodes only) feeds
        each sampled token back on the device, so the whole burst has one host sync, at the end.
        """
        return self.wait(self.launch(out))

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput) -> InFlight:
        """Queue the step (or burst) on the device and return at once; `wait` reads its tokens."""
        self.copy_blocks(out.copies)
        scoring = plan_scoring(out)
        # NOTE: prompt logprobs read the hidden states of every position: an eager forward
        shape = None if self.graphs is None or scoring is not None else self.graphs.shape_for(out)
        inputs = self.prepare(out, shape)
        sampling = [s for s in out.scheduled if s.do_sample]
        if not sampling:
            self._logits(inputs, shape, scoring)  # K/V written, nothing to sample
            self._save_states(out)
            return InFlight(out, prompt_scoring=scoring)
        seqs = [s.seq for s in sampling]
        params = [seq.sampling_params for seq in seqs]
        # NOTE: only these read the rows' tokens
        counted = any(p.has_penalties or p.min_tokens or p.bad_words_token_ids for p in params)
        histories = [(seq.token_ids, seq.num_prompt_tokens) for seq in seqs] if counted else None
        model = self.config.model
        batch = self.sampler.prepare([seq.request_id for seq in seqs], params, histories, model.vocab_size,
                                     model.eos_token_ids)  # fmt: skip
        flight = self._run_steps(out, inputs, shape, batch, None, scoring)
        flight.prompt_scoring = scoring
        return flight

    @torch.inference_mode()
    def launch_continuation(self, last: InFlight, out: SchedulerOutput) -> InFlight:
        """Queue the burst `out` that continues `last` (the same requests, decoding; `last` may still be running):
        its first step feeds back `last`'s final tokens on the device, as a burst's later steps do, so it is
        built with no host sync and runs right behind `last` (async scheduling)."""
        self.copy_blocks(out.copies)  # NOTE: evictions to the host tier, queued before the burst writes the blocks
        inputs = last.inputs
        tables = [s.seq.block_table for s in out.scheduled]
        if any(len(t) > n for t, n in zip(tables, last.table_lens, strict=True)):  # the scheduler took new blocks
            inputs = self._with_tables(inputs, tables, last.shape)
        return self._run_steps(out, inputs, last.shape, last.batch, last.last_sampled)

    def wait(self, flight: InFlight) -> list[list[int]]:
        """The tokens `flight` sampled for each scheduled request, one per step ([] where it only prefilled): the
        host sync (a continuation queued behind it is not waited for)."""
        if flight.sampled is None:
            return [[] for _ in flight.out.scheduled]
        if flight.ready is not None:
            flight.ready.synchronize()
        rows = iter(flight.sampled.tolist())
        return [next(rows) if s.do_sample else [] for s in flight.out.scheduled]

    def _with_tables(self, inputs: StepInputs, tables: list[list[int]], shape) -> StepInputs:
        """`inputs` reading the requests' block tables as they are now."""
        if shape is not None:
            self.graphs.static.stage_tables(tables)  # NOTE: the tables of `inputs` are views of these buffers
            return inputs
        staged = StepMetadata.table_tensor(tables)
        staged = staged.pin_memory() if self.device.type == "cuda" else staged  # NOTE: pageable would wait for the GPU
        meta = dataclasses.replace(inputs.meta, block_tables=staged.to(self.device, non_blocking=True))
        return dataclasses.replace(inputs, meta=meta)

    def _run_steps(self, out: SchedulerOutput, inputs: StepInputs, shape, batch, sampled, scoring=None) -> InFlight:
        """The step, or each step of the burst, on the device; `sampled`: the tokens the first step feeds back
        (a continuation), or None (its inputs are prepared); `scoring`: the step's prompt logprobs to compute."""
        num_rows, k = len(batch.request_ids), batch.num_logprobs
        tokens = torch.empty(num_rows, out.num_steps, dtype=torch.long, device=self.device)
        logprobs = None if k is None else torch.empty(num_rows, out.num_steps, 2 + 2 * k, device=self.device)
        for step in range(out.num_steps):
            fed_back = tokens[:, step - 1] if step else sampled
            if fed_back is not None:
                inputs = self._advance(inputs, fed_back, shape)
            logits, greedy = self._logits(inputs, shape, scoring)
            tokens[:, step] = self.sampler(logits, batch, greedy)  # NOTE: a graph's outputs live until its next replay
            if logprobs is not None:
                logprobs[:, step] = token_logprobs(logits, tokens[:, step], k)
        self._save_states(out)
        last_sampled = tokens[:, -1]  # (num_sampling,): what a continuation feeds back
        ready = None
        if tokens.is_cuda:  # NOTE: copied to pinned memory now, so that `wait` waits for this step alone, not for
            tokens = tokens.to("cpu", non_blocking=True)  # a continuation queued behind it
            logprobs = None if logprobs is None else logprobs.to("cpu", non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        table_lens = [len(s.seq.block_table) for s in out.scheduled]
        return InFlight(out, tokens, ready, inputs, last_sampled, batch, shape, table_lens, logprobs)

    def _save_states(self, out: SchedulerOutput) -> None:
        if self.state_tensors is not None:
            self.state_tensors.after_forward(out.state_ops)

    def _advance(self, inputs: StepInputs, sampled: torch.Tensor, shape: tuple[int, int] | None) -> StepInputs:
        """The next decode step of a burst, fed `sampled`: in the graph's buffers where `inputs` are staged there."""
        if shape is None:
            return advance_decode_inputs(inputs, sampled, self.block_size)
        self.graphs.static.advance(inputs, sampled)
        return inputs

    def _logits(
        self, inputs: StepInputs, shape: tuple[int, int] | None, scoring: PromptScoring | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[num_sampling, vocab] in the model's dtype, and their greedy tokens where a graph computed them (else
        None): eagerly, or by replaying the graph of `shape` (a bucket, or None). `scoring` (eager steps): the prompt
        logprobs to compute from the hidden states."""
        if shape is not None:
            return self.graphs.run(inputs, shape)
        hidden = self.model(inputs.input_ids, inputs.meta, self.kv_cache)
        if scoring is not None:
            score(scoring, hidden, self.model.compute_logits, self.config.model.vocab_size)
        return self.model.compute_logits(hidden[inputs.logits_indices]), None

    @torch.inference_mode()
    def prompt_logits(self, out: SchedulerOutput) -> torch.Tensor:
        """float32 logits of every query token of one step (tests compare them with transformers)."""
        self.copy_blocks(out.copies)
        inputs = self.prepare(out)
        logits = self.model.compute_logits(self.model(inputs.input_ids, inputs.meta, self.kv_cache))
        self._save_states(out)
        return logits.float()
