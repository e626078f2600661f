"""GPU-only checks (`pytest -m gpu` on the GPU machine; skipped with the reason elsewhere)."""

import os
import re
from dataclasses import replace

import pytest
import torch

import minipic_lite as mp

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512, max_position_embeddings=512)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 2.0)  # logits far apart: graph vs eager rounding never flips a token
    path = tmp_path_factory.mktemp("tiny_gpu")
    model.save_pretrained(path)
    return path


def greedy_runs(engines, seed: int) -> tuple[list[list[int]], list]:
    """Five random prompts of 5 to 63 tokens (batch 5, a graph bucket of 8) and each engine's 16 greedy tokens for
    them: (prompts, [outputs of each engine])."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(6, 512, (n,), generator=gen).tolist() for n in (5, 17, 33, 40, 63)]
    params = mp.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    return prompts, [engine.generate(prompts, params, use_tqdm=False) for engine in engines]


def assert_same_greedy_tokens(llm: mp.LLM, eager: mp.LLM, seed: int) -> None:
    """`greedy_runs`' prompts: the same tokens from both engines."""
    _, (ours, theirs) = greedy_runs((llm, eager), seed)
    assert [o.token_ids for o in ours] == [o.token_ids for o in theirs]


@pytest.mark.parametrize(
    ("num_scheduler_steps", "async_scheduling"), [(1, False), (8, False), (1, True), (8, True)],
    ids=["steps", "bursts", "async_steps", "async_bursts"],
)  # fmt: skip
def test_cuda_graph_replay_gives_the_eager_tokens(tiny_dir, num_scheduler_steps, async_scheduling):
    """Graph replays (bursts, and with async scheduling bursts queued behind the last, taking blocks as they cross
    into them) against an eager engine with one step per visit; then stop tokens that end requests mid-burst."""
    kwargs = dict(device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8, num_blocks=256)
    graphs = mp.LLM(str(tiny_dir), num_scheduler_steps=num_scheduler_steps, async_scheduling=async_scheduling,
                    **kwargs)  # fmt: skip
    eager = mp.LLM(str(tiny_dir), enforce_eager=True, num_scheduler_steps=1, async_scheduling=False, **kwargs)
    assert graphs.engine.runner.graphs is not None and eager.engine.runner.graphs is None
    if "OMP_NUM_THREADS" not in os.environ:  # engine_loop.fewer_cpu_threads
        assert graphs._loop.call(lambda engine: torch.get_num_threads()) == 1
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(6, 512, (n,), generator=gen).tolist() for n in (5, 17, 33, 40, 63)]  # batch 5 -> 8
    params = mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    replayed = graphs.generate(prompts, params, use_tqdm=False)
    reference = eager.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in replayed] == [o.token_ids for o in reference]
    assert all(len(o.token_ids) == 24 for o in replayed)
    assert graphs.engine.stats.num_continuations > 0 if async_scheduling else graphs.engine.stats.num_continuations == 0
    # each request stops on its own token, at output 4 + 3 i (mid-burst)
    stops = [o.token_ids[4 + 3 * i] for i, o in enumerate(reference)]
    cut = [o.token_ids[: o.token_ids.index(t) + 1] for o, t in zip(reference, stops, strict=True)]
    stopping = [mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop_token_ids=[t]) for t in stops]
    assert [o.token_ids for o in graphs.generate(prompts, stopping, use_tqdm=False)] == cut
    graphs.engine.pool.check_integrity()
    assert graphs.engine.in_flight is None and graphs.engine.pool.num_free_blocks == graphs.engine.pool.num_blocks


def test_penalties_through_graph_bursts_give_the_eager_and_transformers_tokens(tiny_dir):
    """Greedy rows with penalties take the argmax after them, not the graph's, and count their tokens on the device
    through bursts and continuations: the tokens (and logprobs) of an eager engine with one step per visit; with the
    repetition penalty alone, transformers' generate() on the same weights."""
    from transformers import AutoModelForCausalLM

    kwargs = dict(device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8, num_blocks=256)
    graphs = mp.LLM(str(tiny_dir), num_scheduler_steps=8, async_scheduling=True, **kwargs)
    eager = mp.LLM(str(tiny_dir), enforce_eager=True, num_scheduler_steps=1, async_scheduling=False, **kwargs)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(6, 512, (n,), generator=gen).tolist() for n in (5, 17, 33, 40, 63)]
    rows = [dict(repetition_penalty=1.8), dict(frequency_penalty=1.5, presence_penalty=0.5), dict()]
    params = [mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=2, **rows[i % 3])
              for i in range(5)]  # fmt: skip
    outs = graphs.generate(prompts, params, use_tqdm=False)
    reference = eager.generate(prompts, params, use_tqdm=False)
    replayed = [o.token_ids for o in outs]
    assert replayed == [o.token_ids for o in reference]
    assert graphs.engine.stats.num_continuations > 0
    for out, ref in zip(outs, reference, strict=True):  # logprobs through graph bursts: the eager engine's
        assert len(out.logprobs) == len(out.token_ids) == 24
        for entry, ref_entry in zip(out.logprobs, ref.logprobs, strict=True):
            assert list(entry) == list(ref_entry)
            assert all(abs(entry[t].logprob - ref_entry[t].logprob) < 1e-3 for t in entry)
    hf = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).to("cuda").eval()
    hf.generation_config.eos_token_id = None  # NOTE: never stop early, as ignore_eos
    for i in (0, 3):  # the repetition-penalty rows
        ids = torch.tensor([prompts[i]], device="cuda")
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                              repetition_penalty=1.8, pad_token_id=0)  # fmt: skip
        assert replayed[i] == out[0, ids.shape[1] :].tolist(), i
    plain = mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    assert replayed[0] != graphs.generate([prompts[0]], plain, use_tqdm=False)[0].token_ids, "no penalty was felt"


def test_n_completions_through_graph_bursts_are_their_seeded_requests(tiny_dir):
    """n completions of one prompt run as n requests through graph bursts and continuations: completion i is the
    request with seed + i in the same batch shape, a stream ends with them, and greedy ones are the eager tokens."""
    kwargs = dict(device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8, num_blocks=256)
    graphs = mp.LLM(str(tiny_dir), num_scheduler_steps=8, async_scheduling=True, **kwargs)
    eager = mp.LLM(str(tiny_dir), enforce_eager=True, num_scheduler_steps=1, async_scheduling=False, **kwargs)
    prompt = torch.randint(6, 512, (40,), generator=torch.Generator().manual_seed(9)).tolist()
    params = mp.SamplingParams(max_tokens=24, temperature=1.0, seed=11, n=3, ignore_eos=True)
    (out,) = graphs.generate([prompt], params, use_tqdm=False)
    alone = graphs.generate([prompt] * 3, [params.child(i) for i in range(3)], use_tqdm=False)
    assert [c.token_ids for c in out.outputs] == [a.token_ids for a in alone]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    last = list(graphs.stream(prompt, params))[-1]
    assert last.finished and [c.token_ids for c in last.outputs] == [c.token_ids for c in out.outputs]
    greedy = mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, n=4)
    (replayed,) = graphs.generate([prompt], greedy, use_tqdm=False)
    (reference,) = eager.generate([prompt], greedy.child(0), use_tqdm=False)
    assert [c.token_ids for c in replayed.outputs] == [reference.token_ids] * 4
    assert graphs.engine.stats.num_continuations > 0


def test_min_tokens_through_graph_bursts_gives_the_eager_tokens(tiny_dir):
    """The stop tokens blocked over the graph's argmax and counted down on the device through bursts and
    continuations: the eager engine's tokens, one step a visit."""
    kwargs = dict(device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8, num_blocks=256)
    graphs = mp.LLM(str(tiny_dir), num_scheduler_steps=8, async_scheduling=True, **kwargs)
    eager = mp.LLM(str(tiny_dir), enforce_eager=True, num_scheduler_steps=1, async_scheduling=False, **kwargs)
    gen = torch.Generator().manual_seed(13)
    prompts = [torch.randint(6, 512, (n,), generator=gen).tolist() for n in (9, 30, 47)]
    plain = eager.generate(prompts, mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True), use_tqdm=False)
    stops = [out.token_ids[1] for out in plain]  # each answer's second token: blocked for its first 11
    params = [mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, min_tokens=11, stop_token_ids=[t])
              for t in stops]  # fmt: skip
    outs = graphs.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [o.token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    assert all(stop not in out.token_ids[:11] for stop, out in zip(stops, outs, strict=True))
    assert graphs.engine.stats.num_continuations > 0


def test_prompt_logprobs_on_the_gpu_are_transformers_beside_graph_steps(tiny_dir):
    """A step scoring a prompt runs eagerly (its hidden states are read), beside requests that replay graphs."""
    from transformers import AutoModelForCausalLM

    llm = mp.LLM(str(tiny_dir), device="cuda", dtype="float32", max_model_len=256, max_num_batched_tokens=64,
                 num_blocks=256)  # fmt: skip
    prompt = torch.randint(6, 512, (150,), generator=torch.Generator().manual_seed(21)).tolist()
    decoding = llm.stream([7] * 20, mp.SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    next(decoding)
    params = mp.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, prompt_logprobs=3)
    (out,) = llm.generate([prompt], params, use_tqdm=False)
    list(decoding)
    hf = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).to("cuda").eval()
    with torch.no_grad():
        expected = hf(torch.tensor([prompt], device="cuda")).logits[0].float().log_softmax(dim=-1).cpu()
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for position, entry in enumerate(out.prompt_logprobs[1:], start=1):
        token, row = prompt[position], expected[position - 1]
        assert abs(entry[token].logprob - row[token].item()) < 1e-3
        assert set(entry) == {token, *row.topk(3).indices.tolist()}


def test_logit_bias_and_allowed_tokens_through_graph_bursts_give_the_eager_tokens(tiny_dir):
    """The rules applied over the graph's argmax at every step of bursts and continuations: the eager tokens."""
    kwargs = dict(device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8, num_blocks=256)
    graphs = mp.LLM(str(tiny_dir), num_scheduler_steps=8, async_scheduling=True, **kwargs)
    eager = mp.LLM(str(tiny_dir), enforce_eager=True, num_scheduler_steps=1, async_scheduling=False, **kwargs)
    gen = torch.Generator().manual_seed(17)
    prompts = [torch.randint(6, 512, (n,), generator=gen).tolist() for n in (12, 37)]
    plain = eager.generate(prompts, mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True), use_tqdm=False)
    params = [
        mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logit_bias={plain[0].token_ids[0]: -100}),
        mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, allowed_token_ids=list(range(100, 300))),
    ]
    outs = graphs.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [o.token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    assert plain[0].token_ids[0] not in outs[0].token_ids and set(outs[1].token_ids) <= set(range(100, 300))
    assert graphs.engine.stats.num_continuations > 0


def test_bad_words_through_graph_bursts_give_the_eager_tokens(tiny_dir):
    """A word's recent tokens taken on the device at every step of bursts and continuations: the eager tokens, and
    no blocked pair in the output."""
    kwargs = dict(device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8, num_blocks=256)
    graphs = mp.LLM(str(tiny_dir), num_scheduler_steps=8, async_scheduling=True, **kwargs)
    eager = mp.LLM(str(tiny_dir), enforce_eager=True, num_scheduler_steps=1, async_scheduling=False, **kwargs)
    gen = torch.Generator().manual_seed(23)
    prompts = [torch.randint(6, 512, (n,), generator=gen).tolist() for n in (15, 40)]
    greedy = mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain = eager.generate(prompts, greedy, use_tqdm=False)
    words = [[o.token_ids[5], o.token_ids[6]] for o in plain]  # a pair each output holds, mid-burst
    params = [replace(greedy, bad_words_token_ids=(tuple(w),)) for w in words]
    outs = graphs.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [o.token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    for out, word in zip(outs, words, strict=True):
        assert tuple(word) not in set(zip(out.token_ids, out.token_ids[1:], strict=False))
    assert [o.token_ids for o in outs] != [o.token_ids for o in plain]
    assert graphs.engine.stats.num_continuations > 0


def test_prefill_and_mixed_steps_replay_graphs_and_give_the_eager_tokens(tiny_dir):
    """Prompts whose prefixes are cached (few new tokens each), and requests admitted while others decode (mixed
    steps), run through the prefill buckets' graphs with the tokens of an eager engine."""
    kwargs = dict(device="cuda", dtype="float32", max_model_len=256, max_num_seqs=4, num_blocks=256)
    graphs = mp.LLM(str(tiny_dir), **kwargs)
    eager = mp.LLM(str(tiny_dir), enforce_eager=True, **kwargs)
    step_graphs = graphs.engine.runner.graphs
    replayed_shapes = []
    run = step_graphs.run
    step_graphs.run = lambda inputs, shape: (replayed_shapes.append(shape), run(inputs, shape))[1]
    gen = torch.Generator().manual_seed(3)
    bases = [torch.randint(6, 512, (n,), generator=gen).tolist() for n in (40, 57, 70, 90, 33, 64)]
    follow_ups = [b + torch.randint(6, 512, (5 + 3 * i,), generator=gen).tolist() for i, b in enumerate(bases)]
    # different lengths: requests finish at different steps, so waiting ones join running decodes
    params = [mp.SamplingParams(max_tokens=6 + 5 * i, temperature=0.0, ignore_eos=True) for i in range(6)]
    for prompts in (bases, follow_ups):
        outs = graphs.generate(prompts, params, use_tqdm=False)
        assert [o.token_ids for o in outs] == [o.token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    assert all(o.num_cached_tokens >= 32 for o in outs)  # the follow-ups hit their bases' full blocks
    prefill_shapes = {shape for shape in replayed_shapes if shape[0] != shape[1]}
    assert prefill_shapes, f"no prefill bucket replayed: {sorted(set(replayed_shapes))}"
    graphs.engine.kv.check_integrity()


@pytest.mark.parametrize("span_policy", ["isps", "barrier"])
def test_host_tier_copies_and_span_policies_on_cuda_give_the_roomy_inline_tokens(tiny_dir, span_policy):
    """Pinned host blocks copied back before the forward (non-blocking, stream-ordered), span prefills beside
    CUDA-graph decodes: the tokens of a roomy cache with the inline policy."""
    control = mp.ControlTokens(ssep_id=3, pdep_id=4, pad_id=5)
    kwargs = dict(device="cuda", dtype="float32", max_model_len=256, max_num_seqs=4, control_tokens=control)
    roomy = mp.LLM(str(tiny_dir), num_blocks=512, **kwargs)
    small = mp.LLM(str(tiny_dir), num_blocks=16, host_cache_gib=64 * roomy.engine.runner.block_bytes / 2**30,
                   span_policy=span_policy, max_num_batched_tokens=64, **kwargs)  # fmt: skip
    gen = torch.Generator().manual_seed(2)
    docs = [[3, *torch.randint(6, 512, (30,), generator=gen).tolist(), 5] for _ in range(12)]  # 2 blocks each
    prompts = [[7, 8, 9] + [5] * 13 + docs[i] + docs[(i + 5) % 12] + [4, 10 + i, 11] for i in range(12)]
    prompts += prompts[::-1]  # 25 blocks of documents and system turn against 16 on the device
    params = mp.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    expected = [o.token_ids for o in roomy.generate(prompts, params, use_tqdm=False)]
    got = [o.token_ids for p in prompts for o in small.generate([p], params, use_tqdm=False)]
    assert got == expected
    assert small.stats()["num_host_hit_blocks"] > 0
    small.engine.kv.check_integrity()


@pytest.fixture(scope="module")
def hybrid_gpu(tmp_path_factory):
    from tests.hybrid_models import make_hybrid

    path = tmp_path_factory.mktemp("hybrid_gpu")
    hf = make_hybrid(path, decays=None)  # NOTE: transformers' draw, on which the tolerances below were measured
    with torch.no_grad():
        hf.lm_head.weight.normal_(0.0, 2.0)  # logits far apart
    hf.save_pretrained(path)
    return path, hf.to("cuda")


def _worst_gap(hf, token_ids, generated) -> float:
    """Teacher-forced through transformers (float32): the largest amount by which a generated token's logit falls
    short of the best logit at its position, relative to the largest logit. 0 when every token is the argmax."""
    ids = torch.tensor([token_ids + generated[:-1]], device="cuda")
    with torch.no_grad():
        logits = hf(ids).logits[0, len(token_ids) - 1 :].float()  # the rows that predict each generated token
    chosen = logits.gather(1, torch.tensor(generated, device="cuda")[:, None])[:, 0]
    return ((logits.max(-1).values - chosen).max() / logits.abs().max()).item()


# NOTE: measured on the H200 at 4a3495f: float32 passes at 1e-2; bfloat16's worst gap was 0.054 (one token of 10
# prompts x 12, the others 0 to 0.029). fla's decode taking beta as a decay, fixed there, gave gaps of 0.9 to 1.3.
@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-2), ("bfloat16", 1e-1)])
def test_hybrid_on_cuda_follows_transformers_and_resumes_from_checkpoints(hybrid_gpu, dtype, tolerance):
    """The hybrid's fla path (q, k, v in the model dtype, L2 norm and GVA in the kernel, varlen chunks and the
    fused decode step), with chunked prefill and batched decode: every greedy token is transformers' argmax
    (float32, fla too when installed) up to rounding, teacher-forced. Exact token equality is not asked: fla
    computes in tf32 and its chunks fall elsewhere than in transformers' one-call prefill. Run again, the
    prompts resume from checkpoints and still follow transformers."""
    path, hf = hybrid_gpu
    llm = mp.LLM(str(path), device="cuda", dtype=dtype, num_blocks=128, max_model_len=512, max_num_batched_tokens=64)
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, 256, (70,), generator=gen).tolist()
    prompts = [prefix + torch.randint(0, 256, (n,), generator=gen).tolist() for n in (30, 3, 50)]
    prompts += [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (1, 130)]
    params = mp.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    again = llm.generate(prompts, params, use_tqdm=False)  # now from checkpoints
    gaps = [_worst_gap(hf, p, o.token_ids) for run in (outs, again) for p, o in zip(prompts, run, strict=True)]
    assert max(gaps) <= tolerance, gaps
    assert sum(o.state_report.resume_position > 0 for o in again) >= 4
    llm.engine.kv.check_integrity()


def test_one_row_steps_through_inductors_reduction_give_the_eager_tokens(tiny_dir, monkeypatch):
    """Batch-1 decode with every projection routed to the reduction (models/routed_linear.py), won or not, gives
    the tokens of the eager engine (cuBLAS); the routed function is one Triton reduction kernel, not a matmul."""
    from torch._inductor.utils import run_and_get_code

    from minipic_lite.models import routed_linear

    monkeypatch.setattr(routed_linear, "CUBLAS_MARGIN", 0.99)  # take it wherever it was timed
    kwargs = dict(device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8, num_blocks=256)
    routed = mp.LLM(str(tiny_dir), **kwargs)
    timings = routed.engine.runner.one_row_timings
    assert timings and all(t["chosen"] != "cublas" for t in timings.values()), timings
    eager = mp.LLM(str(tiny_dir), enforce_eager=True, **kwargs)
    gen = torch.Generator().manual_seed(3)
    params = mp.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    for n in (5, 40):  # one request at a time: every decode step has one row
        prompt = torch.randint(6, 512, (n,), generator=gen).tolist()
        ours, theirs = (llm.generate([prompt], params, use_tqdm=False)[0] for llm in (routed, eager))
        assert ours.token_ids == theirs.token_ids
    o_proj = routed.engine.runner.model.layers[0].self_attn.o_proj
    x = torch.randn(1, o_proj.weight.shape[1], device="cuda")
    with torch.inference_mode():  # as the engine calls it
        _, code = run_and_get_code(o_proj.one_row, x, o_proj.weight, o_proj.bias)
    code = "".join(code)
    # NOTE: a reduction over 128 features is a persistent one (triton_per_*), a longer one looped (triton_red_*)
    assert re.search(r"def triton_(per|red)_", code) and not re.search(r"extern_kernels\.(add)?mm\(", code), code


def test_steps_routed_to_cublaslt_give_the_eager_tokens(tiny_dir, monkeypatch):
    """Graph buckets of several rows with every projection routed to cuBLASLt (models/routed_linear.py), won or not,
    give the eager engine's tokens (cuBLAS); the routed call equals F.linear and leaves torch's preferred library as
    it found it."""
    import torch.nn.functional as F

    from minipic_lite.models import routed_linear

    monkeypatch.setattr(routed_linear, "LT_MARGIN", float("-inf"))  # take it wherever it was timed
    kwargs = dict(device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8, num_blocks=256)
    routed = mp.LLM(str(tiny_dir), **kwargs)
    timings = routed.engine.runner.blas_timings
    assert timings and all(t["chosen"] == "cublaslt" for rows in timings.values() for t in rows.values()), timings
    assert all({2, 4, 8, 16} <= set(rows) and 1 not in rows for rows in timings.values()), timings
    eager = mp.LLM(str(tiny_dir), enforce_eager=True, **kwargs)
    assert_same_greedy_tokens(routed, eager, seed=4)
    o_proj = routed.engine.runner.model.layers[0].self_attn.o_proj
    x = torch.randn(8, o_proj.weight.shape[1], device="cuda")
    before = torch.backends.cuda.preferred_blas_library()
    with torch.inference_mode():
        torch.testing.assert_close(o_proj.by_rows[8](x, o_proj.weight, o_proj.bias), F.linear(x, o_proj.weight))
    assert torch.backends.cuda.preferred_blas_library() == before


def greedy_regrets(model, prompts: list[list[int]], outs) -> list[float]:
    """For each prompt, the worst gap over its generated tokens between `model`'s best logit and its logit of the
    chosen token (teacher-forced: one forward over prompt + tokens)."""
    regrets = []
    for ids, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([ids + out.token_ids], device="cuda")).logits[0, len(ids) - 1 : -1].float()
        chosen = logits.gather(1, torch.tensor(out.token_ids, device="cuda")[:, None])[:, 0]
        regrets.append((logits.max(dim=-1).values - chosen).max().item())
    return regrets


def test_steps_routed_to_the_skinny_matmul_pick_tokens_as_near_best_as_cublas(tiny_dir, monkeypatch):
    """By default (bf16, Hopper) the graphs' buckets of few rows take ops/skinny_matmul.py's matmul for every
    projection it can run, its call equals F.linear, and its greedy tokens sit as near float32's best as the eager
    engine's (cuBLAS) do.

    NOTE: not the eager engine's tokens: two bf16 engines whose matmuls round differently part at near ties
    (measured on the H200 at 793b7b0: the same 9 tokens, then one prompt in five parted, run after run, with PDL on
    or off; alone, at 1-64 rows, the kernel's largest error against float64 equalled cuBLAS's on the 8B's
    projections and on small ones of K 64-256). Tokens that are not the model's sit tens of units below its best,
    past the bound. Passed on an H100 at 5a1675b (bench/results/gpu_tests-5a1675b-h100-skinny.log)."""
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the skinny matmul reads its weights through TMA: Hopper and later")
    monkeypatch.delenv("MINIPIC_SKINNY_MATMUL", raising=False)
    kwargs = dict(device="cuda", dtype="bfloat16", max_model_len=256, max_num_seqs=8, num_blocks=256)
    routed = mp.LLM(str(tiny_dir), **kwargs)
    timings = routed.engine.runner.blas_timings
    chosen = {(key, n): t["chosen"] for key, rows in timings.items() for n, t in rows.items()}
    assert chosen and all(c == "skinny" for (_, n), c in chosen.items() if n <= 64), timings
    monkeypatch.setenv("MINIPIC_SKINNY_MATMUL", "0")
    eager = mp.LLM(str(tiny_dir), enforce_eager=True, **kwargs)
    prompts, (ours, theirs) = greedy_runs((routed, eager), seed=5)
    truth = LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).cuda().eval()
    ours_worst, cublas_worst = max(greedy_regrets(truth, prompts, ours)), max(greedy_regrets(truth, prompts, theirs))
    print(f"worst greedy regret under float32: skinny {ours_worst:.3f}, cuBLAS {cublas_worst:.3f}")
    # NOTE: the CPU's bf16 engine on this model and these prompts: worst regret 0.36; each token moved one id on: 91-111
    assert ours_worst <= max(2 * cublas_worst, 2.0)
    layer = routed.engine.runner.model.layers[0]
    for proj in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        x = torch.randn(24, proj.weight.shape[1], device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            expected = F.linear(x.float(), proj.weight.float())
            got = proj.by_rows[24](x, proj.weight, proj.bias).float()
        torch.testing.assert_close(got, expected, atol=2e-2 * expected.abs().max().item(), rtol=0)


def test_the_compiled_kv_write_is_one_kernel_at_decode():
    """A decode step's keys and values go into one layer's caches with one Triton kernel (two index copies took
    two on the H200), in place."""
    from torch._inductor.utils import run_and_get_code

    from minipic_lite.models.llama import compile_kernel, write_kv

    kv_cache = torch.zeros(2, 3, 8, 16, 2, 64, device="cuda", dtype=torch.bfloat16)  # [2, layers, blocks, B, KVH, D]
    qkv = torch.randn(1, 128 + 2 * 2 * 64, device="cuda", dtype=torch.bfloat16)
    k, v = qkv[:, 128:].view(1, 2, 2, 64).unbind(1)  # (1, KVH, D) each: views, as the layer passes them
    slot = torch.tensor([37], device="cuda")
    torch._dynamo.reset()
    code = "".join(run_and_get_code(compile_kernel(write_kv), k, v, slot, kv_cache[:, 1].flatten(1, 2))[1])
    assert len(set(re.findall(r"def (triton_\w+)\(", code))) == 1, code
    rows = kv_cache[:, 1].flatten(1, 2)
    assert torch.equal(rows[0, 37], k[0]) and torch.equal(rows[1, 37], v[0])
    assert int((kv_cache != 0).sum()) == 2 * 2 * 64  # nothing else written, no other layer


def test_rope_and_the_kv_write_are_one_kernel():
    """The queries' rotation and the K/V write launch as one kernel (Inductor's combo kernels: ROPE_WRITE_OPTIONS), at
    decode's one token (exact shapes) and at 64 tokens (the token count then symbolic), position-free; two in the
    vanilla mode."""
    from torch._inductor.utils import run_and_get_code

    from minipic_lite.models.llama import Kernels, rope_and_write_kv
    from ops import rope_cos_sin

    torch._dynamo.reset()
    compiled, cos_sin = Kernels.compiled().rope_and_write_kv, rope_cos_sin(4096, 64).cuda()
    for rotate_keys in (False, True):
        for num_tokens in (1, 64):
            kv_cache = torch.zeros(2, 2, 8, 16, 2, 64, device="cuda", dtype=torch.bfloat16)  # [2, L, blocks, B, KVH, D]
            qkv = torch.randn(num_tokens, 4 * 64 + 2 * 2 * 64, device="cuda", dtype=torch.bfloat16)
            q = qkv[:, : 4 * 64].view(num_tokens, 4, 64)
            k, v = qkv[:, 4 * 64 :].view(num_tokens, 2, 2, 64).unbind(1)  # views, as the layer passes them
            pos = torch.randint(0, 4096, (num_tokens,), device="cuda")
            slots = torch.randperm(8 * 16, device="cuda")[:num_tokens]
            args = (q, k, v, pos, cos_sin, slots)
            q_rot, code = run_and_get_code(compiled, *args, kv_cache[:, 1].flatten(1, 2), rotate_keys)
            kernels = set(re.findall(r"def (triton_\w+)\(", "".join(code)))
            # NOTE: the vanilla mode's write waits on the keys' rotation (two kernels, three before: next32-d3f8e7a)
            most = 2 if rotate_keys else 1
            assert len(kernels) <= most, f"{num_tokens} tokens, rotate_keys={rotate_keys}: {sorted(kernels)}"
            want = torch.zeros_like(kv_cache)
            torch.testing.assert_close(q_rot, rope_and_write_kv(*args, want[:, 1].flatten(1, 2), rotate_keys))
            assert torch.equal(kv_cache[1], want[1]) and not kv_cache[:, 0].any()  # values bit-exact; layer 0 untouched
            if rotate_keys:  # NOTE: Inductor fuses the rotation's multiply-adds: a key may differ by one bf16 rounding
                torch.testing.assert_close(kv_cache[0], want[0])
                assert torch.equal(kv_cache[0] != 0, want[0] != 0)
            else:
                assert torch.equal(kv_cache[0], want[0])  # keys position-free: copies


def test_a_graph_engine_serves_greedy_and_sampled_requests_in_one_burst(tiny_dir):
    """Greedy and seeded sampled requests in one batch, in bursts, through the decode and prefill buckets' graphs
    (the second round hits the first's cached prompts): every request gets its tokens, greedy ones the eager
    engine's. NOTE: not yet run on the GPU in this form. A compiled argmax in the sampler (19a158b, reverted) failed
    here with struct.error (a non-integer input id staged, next33e-19a158b-cuda-gpu_tests_step_ops.log); whether the
    eager sampler fails the same way is what this test says."""
    kwargs = dict(device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8, num_blocks=256,
                  num_scheduler_steps=4)  # fmt: skip
    llm = mp.LLM(str(tiny_dir), **kwargs)
    eager = mp.LLM(str(tiny_dir), enforce_eager=True, **kwargs)
    gen = torch.Generator().manual_seed(2)
    greedy = mp.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    sampled = mp.SamplingParams(max_tokens=12, temperature=0.7, seed=3, ignore_eos=True)
    prompts = [torch.randint(6, 512, (9 + 4 * i,), generator=gen).tolist() for i in range(5)]
    params = [sampled if i % 2 else greedy for i in range(5)]
    for _ in range(2):
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert all(len(o.token_ids) == 12 and all(isinstance(t, int) for t in o.token_ids) for o in outs)
        ref = eager.generate(prompts, params, use_tqdm=False)
        assert [o.token_ids for o in outs[::2]] == [o.token_ids for o in ref[::2]]  # the greedy rows


def test_argmax_rows_on_cuda_takes_the_first_maximum_as_torch_argmax_does():
    from minipic_lite.sampler import argmax_rows

    logits = torch.randn(64, 128256, device="cuda")
    top = logits.max() + 1
    logits[0, [7, 128255]] = top  # across groups
    logits[1, [300, 301]] = top  # inside one group
    logits[2] = float("-inf")
    logits[3, [9, 5000]] = float("nan")
    logits[4] = logits[4].round()
    assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))
    assert torch.equal(argmax_rows(logits.bfloat16()), logits.bfloat16().argmax(dim=-1))


@pytest.mark.parametrize("position_free", [True, False], ids=["rope", "stored"])
def test_a_mixed_steps_decodes_read_apart_from_its_dense_prefill_match_the_reference(position_free):
    """The op's decode hint on the H200's paths: 24 decodes over 300-2,000 keys (a split decode launch), then two
    prefill chunks over cached keys (the dense launch), bf16, the 8B model's heads; against the float32 reference."""
    from ops import rope_paged_attention, rope_paged_attention_ref
    from ops.testing import SeqSpec, assert_close, make_problem
    from ops.triton_kernel import is_split_worth_it

    seqs = [SeqSpec.decode(300 + 71 * i) for i in range(24)]
    seqs += [SeqSpec(1500, ((900, 1500),)), SeqSpec(700, ((0, 700),), ((64, 320),))]
    problem = make_problem(seqs, 32, 8, 128, 16, torch.bfloat16, None, position_free, seed=3, device="cuda")
    args = problem.args()
    assert is_split_worth_it(args[0].shape[0], len(seqs), 4, 24)
    expected = rope_paged_attention_ref(*args)
    for hint in (24, 0):
        actual = rope_paged_attention(*args, num_decode_seqs=hint)
        assert_close(actual, expected, atol=3e-2, rtol=3e-2, what=f"hint {hint}")
