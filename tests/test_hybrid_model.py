"""The Qwen3.5 hybrid against transformers: the gated delta rule (reference loop, our chunked path,
transformers' torch fallback), prefill logits (fp32 engine vs float64 transformers), greedy tokens against
transformers' generate(), both checkpoint layouts, and the start-up errors."""

import json

import pytest
import torch
import torch.nn.functional as F

import minipic_lite as mp
from minipic_lite.models import gated_delta_rule as gdr
from tests.conftest import max_abs_err
from tests.hybrid_models import make_hybrid, to_released_layout

GREEDY = dict(temperature=0.0, ignore_eos=True)


def _inputs(num_tokens, num_heads=3, k_dim=16, v_dim=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(num_tokens, num_heads, k_dim, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(num_tokens, num_heads, v_dim, generator=g, dtype=dtype)
    decay = -2 * torch.rand(num_tokens, num_heads, generator=g, dtype=dtype)
    beta = torch.rand(num_tokens, num_heads, generator=g, dtype=dtype)
    state = torch.randn(num_heads, k_dim, v_dim, generator=g, dtype=dtype)
    return q, k, v, decay, beta, state


@pytest.mark.parametrize("num_tokens", [1, 5, 63, 64, 65, 131])
def test_chunked_delta_rule_matches_the_loop_and_transformers(num_tokens):
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    q, k, v, decay, beta, state = _inputs(num_tokens)
    qp, kp = gdr.prepare_qk(q, k)
    out_ref, state_ref = gdr.recurrent_gated_delta_rule_ref(qp, kp, v, decay, beta, state)
    out, final = gdr.chunk_gated_delta_rule(qp, kp, v, decay, beta, state)
    assert max_abs_err(out, out_ref) < 2e-5 and max_abs_err(final, state_ref) < 2e-5
    out_hf, final_hf = torch_chunk_gated_delta_rule(
        q[None], k[None], v[None], decay[None], beta[None], initial_state=state[None], output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    assert max_abs_err(out, out_hf[0]) < 2e-5 and max_abs_err(final, final_hf[0]) < 2e-5


def test_decode_step_is_the_loop_for_one_token():
    q, k, v, decay, beta, state = _inputs(1, dtype=torch.float32)
    qp, kp = gdr.prepare_qk(q, k)
    out_ref, state_ref = gdr.recurrent_gated_delta_rule_ref(qp, kp, v, decay, beta, state)
    out, final = gdr.recurrent_step(qp, kp, v, decay, beta, state[None])
    assert torch.equal(out, out_ref) and torch.equal(final[0], state_ref)


def test_chunks_compose_exactly_at_chunk_multiples():
    """Two calls split at a multiple of CHUNK_SIZE compute the same floats as one call (resume's premise)."""
    q, k, v, decay, beta, state = _inputs(100, dtype=torch.float32)
    qp, kp = gdr.prepare_qk(q, k)
    whole, final = gdr.chunk_gated_delta_rule(qp, kp, v, decay, beta, state)
    a, mid = gdr.chunk_gated_delta_rule(qp[:64], kp[:64], v[:64], decay[:64], beta[:64], state)
    b, end = gdr.chunk_gated_delta_rule(qp[64:], kp[64:], v[64:], decay[64:], beta[64:], mid)
    assert torch.equal(torch.cat([a, b]), whole) and torch.equal(end, final)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_5_text")
    return path, make_hybrid(path)


def _llm(path, **options):
    defaults = dict(device="cpu", dtype="float32", num_blocks=96, max_model_len=512, max_num_batched_tokens=64)
    return mp.LLM(str(path), **{**defaults, **options})


def _prefill_logits(llm, token_ids):
    engine = llm.engine
    request_id = engine.add_request(token_ids, mp.SamplingParams(max_tokens=1))
    out = engine.scheduler.schedule()
    assert [s.query_ranges for s in out.scheduled] == [[(0, len(token_ids))]]
    logits = engine.runner.prompt_logits(out)
    engine.abort(request_id)
    return logits


def _prompts(num, lengths, seed=1, vocab=256):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths[:num]]


@pytest.mark.parametrize("layout", ["qwen3_5_text", "qwen3_5"])
def test_prefill_logits_match_transformers_in_float64(hybrid, tmp_path, layout):
    path, hf = hybrid
    if layout == "qwen3_5":
        to_released_layout(path, tmp_path)
        path = tmp_path
        assert json.loads((path / "config.json").read_text())["model_type"] == "qwen3_5"
    llm = _llm(path, max_num_batched_tokens=512, enable_prefix_caching=False)
    hf64 = type(hf)(hf.config).double().eval()
    hf64.load_state_dict(hf.state_dict())
    for token_ids in _prompts(3, [150, 64, 7]):
        logits = _prefill_logits(llm, token_ids)
        with torch.no_grad():
            ref = hf64(torch.tensor([token_ids])).logits[0]
        assert max_abs_err(logits, ref) <= 1e-4


def _hf_greedy(hf, token_ids, max_new_tokens):
    mask = torch.ones(1, len(token_ids), dtype=torch.long)
    with torch.no_grad():
        expected = hf.generate(torch.tensor([token_ids]), attention_mask=mask, max_new_tokens=max_new_tokens,
                               do_sample=False, eos_token_id=None, pad_token_id=0)  # fmt: skip
    return expected[0, len(token_ids) :].tolist()


def test_greedy_tokens_equal_transformers_generate(hybrid):
    """Chunked prefill (64-token budget: chunks end mid-prompt), batched decode, prefix hits + resumes."""
    path, hf = hybrid
    llm = _llm(path)
    prefix = _prompts(1, [70], seed=2)[0]
    prompts = [prefix + tail for tail in _prompts(3, [30, 3, 50], seed=3)] + _prompts(2, [1, 130], seed=4)
    params = mp.SamplingParams(max_tokens=12, **GREEDY)
    outs = llm.generate(prompts, params, use_tqdm=False)
    again = llm.generate(prompts, params, use_tqdm=False)  # now from checkpoints
    for token_ids, out, out2 in zip(prompts, outs, again, strict=True):
        assert out.token_ids == _hf_greedy(hf, token_ids, 12)
        assert out2.token_ids == out.token_ids
    assert sum(o.state_report.resume_position > 0 for o in again) >= 4


def test_a_state_slot_used_again_starts_from_zero(hybrid):
    """Two slots, six requests: the later four each take a slot an earlier request left holding its recurrent state
    (no prefix hits, so each starts from a zeroed slot, not a loaded checkpoint)."""
    path, hf = hybrid
    llm = _llm(path, max_num_seqs=2, enable_prefix_caching=False)
    prompts = _prompts(6, [40, 9, 70, 25, 3, 50], seed=5)
    outs = llm.generate(prompts, mp.SamplingParams(max_tokens=8, **GREEDY), use_tqdm=False)
    assert [o.token_ids for o in outs] == [_hf_greedy(hf, p, 8) for p in prompts]
    assert llm.engine.kv.states.num_slots == 2 and len(llm.engine.kv.states.free_slots) == 2


def test_config_of_the_hybrid(hybrid):
    path, _ = hybrid
    cfg = _llm(path).config.model
    assert cfg.is_hybrid and cfg.layer_types.count("linear_attention") == 3
    assert cfg.num_attention_layers == 1 and cfg.rotary_dim == 8 and cfg.linear.conv_dim == 2 * 32 + 64


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(checkpoint_policy="fancy"), "unknown checkpoint_policy 'fancy'"),
        (dict(checkpoint_prior="dp"), "checkpoint_prior must be a policy that needs no traffic"),
        (dict(state_cache_gib=-1.0), "state_cache_gib must be >= 0"),
        (dict(checkpoints_per_entry=-2), "checkpoints_per_entry must be an integer >= 0"),
        (dict(state_eviction="random"), "state_eviction must be one of lru, flops"),
    ],
)
def test_bad_checkpoint_options_fail_at_start_up(hybrid, options, message):
    path, _ = hybrid
    with pytest.raises(ValueError, match=message):
        _llm(path, **options)


def test_unsupported_layer_types_fail_at_start_up(hybrid, tmp_path):
    path, _ = hybrid
    config = json.loads((path / "config.json").read_text())
    config["layer_types"] = ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"unsupported layer types \['sliding_attention'\]"):
        _llm(tmp_path)


def test_span_markers_are_refused_on_a_hybrid(hybrid):
    path, _ = hybrid
    llm = _llm(path, control_tokens=mp.ControlTokens(ssep_id=3, pdep_id=4, pad_id=5))
    with pytest.raises(ValueError, match="span markers need attention-only models"):
        llm.generate([[3] + [7] * 15 + [9, 9]], mp.SamplingParams(max_tokens=1), use_tqdm=False)


def test_bursts_of_decode_steps_carry_the_state(hybrid):
    """num_scheduler_steps > 1: the state slots advance on the device step after step, as in single steps."""
    path, _ = hybrid
    prompts = _prompts(3, [40, 90, 17], seed=5)
    params = mp.SamplingParams(max_tokens=13, **GREEDY)
    bursts = _llm(path, num_scheduler_steps=4).generate(prompts, params, use_tqdm=False)
    single = _llm(path, enable_prefix_caching=False).generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in bursts] == [o.token_ids for o in single]


def test_fla_chunk_indices_name_each_sequences_chunks_in_order():
    from minipic_lite.models.qwen3_5 import fla_chunk_indices

    assert fla_chunk_indices([3, 64, 65, 1]) == [(0, 0), (1, 0), (2, 0), (2, 1), (3, 0)]
    assert fla_chunk_indices([130], chunk_size=64) == [(0, 0), (0, 1), (0, 2)]


# -- the fla call, checked on the CPU against a stand-in with fla's contract --------------------------------------


def _fla_contract(q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel, output_final_state):
    """fla's gated delta rule contract (0.6.0), stated with our own torch code: q, k [1, T, H, K]; v [1, T, HV, V]
    with HV a multiple of H (GVA: value head h reads q/k head h // (HV / H)); g (log decay), beta [1, T, HV];
    initial_state [N, HV, K, V] for the N sequences of cu_seqlens. Returns o [1, T, HV, V] in v's dtype and the
    final states [N, HV, K, V] in float32."""
    assert q.shape == k.shape and q.dim() == v.dim() == 4 and q.shape[0] == 1 and v.shape[2] % q.shape[2] == 0
    assert g.shape == beta.shape == v.shape[:3] and g.dtype == torch.float32 and use_qk_l2norm_in_kernel
    assert q.dtype == k.dtype == v.dtype == beta.dtype  # fla's tensor-core path: one dtype for q, k, v
    cu = cu_seqlens.tolist()
    assert initial_state.shape == (len(cu) - 1, v.shape[2], q.shape[3], v.shape[3]) and output_final_state
    rep = v.shape[2] // q.shape[2]
    q = (gdr.l2norm(q[0].float()) * scale).repeat_interleave(rep, dim=1)
    k = gdr.l2norm(k[0].float()).repeat_interleave(rep, dim=1)
    outs, finals = [], []
    for n, (start, end) in enumerate(zip(cu, cu[1:], strict=False)):
        part = slice(start, end)
        out, final = gdr.recurrent_gated_delta_rule_ref(q[part], k[part], v[0, part], g[0, part], beta[0, part],
                                                        initial_state[n])  # fmt: skip
        outs.append(out)
        finals.append(final)
    return torch.cat(outs)[None].to(v.dtype), torch.stack(finals)


def fake_chunk(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, *, cu_seqlens, cu_seqlens_cpu, chunk_indices):  # fmt: skip
    """fla 0.6.0's chunk_gated_delta_rule, with its positional order (q, k, v, g, beta, scale, ...)."""
    assert cu_seqlens_cpu.device.type == "cpu" and cu_seqlens_cpu.tolist() == cu_seqlens.tolist()
    from minipic_lite.models.qwen3_5 import fla_chunk_indices

    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    assert chunk_indices.tolist() == [list(c) for c in fla_chunk_indices(lens)]
    return _fla_contract(q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel,
                         output_final_state)  # fmt: skip


def fake_fused(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
               output_final_state=False, use_qk_l2norm_in_kernel=False, *, cu_seqlens):  # fmt: skip
    """fla 0.6.0's fused_recurrent_gated_delta_rule takes per-key and per-value decays (gk, gv) between g and
    beta: the positions are its own, so a call that passes beta fourth or fifth hands it over as a decay."""
    assert gk is None and gv is None and beta is not None
    assert (cu_seqlens[1:] - cu_seqlens[:-1]).eq(1).all()  # decode: one token per sequence
    return _fla_contract(q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel,
                         output_final_state)  # fmt: skip


def test_the_fla_call_computes_what_the_torch_path_does(hybrid, monkeypatch):
    """What the model hands fla on CUDA (dtypes, scale, GVA heads, states, cu_seqlens, chunk indices), given to a
    stand-in that states fla's contract with our torch code: prefill logits and greedy tokens (chunked prefill,
    batched decode, resumes) equal the torch path's."""
    from minipic_lite.models import qwen3_5

    path, _ = hybrid
    prompts = _prompts(1, [70], seed=2)[0]
    prompts = [prompts + tail for tail in _prompts(3, [30, 3, 50], seed=3)] + _prompts(2, [1, 130], seed=4)
    params = mp.SamplingParams(max_tokens=8, **GREEDY)
    torch_path = _llm(path)
    expected = [o.token_ids for o in torch_path.generate(prompts, params, use_tqdm=False)]
    one_step = dict(max_num_batched_tokens=512, enable_prefix_caching=False)
    logits = _prefill_logits(_llm(path, **one_step), prompts[4])
    monkeypatch.setattr(qwen3_5, "_fla_kernels", lambda device: (fake_chunk, fake_fused))
    fla_path = _llm(path)
    for _ in range(2):  # the second time from checkpoints
        assert [o.token_ids for o in fla_path.generate(prompts, params, use_tqdm=False)] == expected
    assert max_abs_err(_prefill_logits(_llm(path, **one_step), prompts[4]), logits) <= 1e-4


def test_every_linear_layer_hands_its_delta_rule_to_fla_where_fla_is_found(hybrid, monkeypatch):
    """Prefill steps go to fla's chunked kernel, decode steps to its fused-recurrent one, once per linear layer and
    step (the stand-ins above), none to the torch path, and the tokens are still transformers' greedy ones."""
    from minipic_lite.models import qwen3_5

    path, hf = hybrid
    calls = []

    def chunk(*args, **kwargs):
        calls.append("chunk")
        return fake_chunk(*args, **kwargs)

    def fused(*args, **kwargs):
        calls.append("fused")
        return fake_fused(*args, **kwargs)

    def torch_path(*args):
        raise AssertionError("the torch path ran where fla is found")

    monkeypatch.setattr(qwen3_5, "_fla_kernels", lambda device: (chunk, fused))
    monkeypatch.setattr(gdr, "chunk_gated_delta_rule", torch_path)
    monkeypatch.setattr(gdr, "recurrent_step", torch_path)
    prompt = _prompts(1, [20], seed=6)[0]
    (out,) = _llm(path, enable_prefix_caching=False).generate([prompt], mp.SamplingParams(max_tokens=4, **GREEDY),
                                                            use_tqdm=False)  # fmt: skip
    assert out.token_ids == _hf_greedy(hf, prompt, 4)
    assert calls == ["chunk"] * 3 + ["fused"] * 3 * 3  # 3 linear layers: one prefill step, then 3 decode steps


# -- the varlen causal conv: one buffer for the step, held to a per-sequence F.conv1d ------------------------------


def test_conv_rows_put_each_window_before_its_tokens():
    from minipic_lite.models.qwen3_5 import conv_rows

    assert conv_rows([3, 1], 2) == ([2, 3, 4, 7], [0, 1, 5, 6], [3, 4, 6, 7])
    assert conv_rows([1], 3) == ([3], [0, 1, 2], [1, 2, 3])
    assert conv_rows([5, 2, 1], 1) == ([1, 2, 3, 4, 5, 7, 8, 10], [0, 6, 9], [5, 8, 10])


def test_the_one_buffer_conv_equals_a_conv1d_per_sequence():
    from minipic_lite.models.qwen3_5 import ConvRows, causal_conv_taps

    gen = torch.Generator().manual_seed(0)
    channels, width, lens = 6, 3, [5, 1, 2, 9]
    mixed = torch.randn(sum(lens), channels, generator=gen, dtype=torch.float64)
    windows = torch.randn(len(lens), channels, width, generator=gen, dtype=torch.float64)
    weight = torch.randn(channels, 1, width + 1, generator=gen, dtype=torch.float64)
    expected, expected_windows, start = [], [], 0
    for s, n in enumerate(lens):  # the reference: each sequence on its own
        seq = torch.cat([windows[s], mixed[start : start + n].T], dim=-1)  # (C, width + n)
        expected.append(F.silu(F.conv1d(seq[None], weight, groups=channels)[0].T))
        expected_windows.append(seq[:, -width:])
        start += n
    rows = ConvRows.build(lens, width, torch.device("cpu"))
    buf = mixed.new_empty(sum(lens) + len(lens) * width, channels)
    buf[rows.windows] = windows.transpose(1, 2).reshape(-1, channels)
    buf[rows.tokens] = mixed
    assert max_abs_err(causal_conv_taps(buf, rows.first, weight[:, 0]), torch.cat(expected)) <= 1e-12
    assert torch.equal(buf[rows.last].view(len(lens), width, channels).transpose(1, 2), torch.stack(expected_windows))


def test_a_hybrid_directory_without_weights_or_with_some_missing_fails_at_start_up(hybrid, tmp_path):
    """No *.safetensors, or a tensor left out of it: a ValueError naming what is missing, not a model of zeros."""
    from safetensors.torch import load_file, save_file

    path, _ = hybrid
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(ValueError, match=r"no \*\.safetensors weights in .*bare"):
        _llm(tmp_path / "bare")
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "config.json").write_text((path / "config.json").read_text())
    weights = load_file(path / "model.safetensors")
    dropped = "model.layers.0.linear_attn.A_log"
    save_file({k: v for k, v in weights.items() if k != dropped}, tmp_path / "partial" / "model.safetensors")
    with pytest.raises(ValueError, match=r"partial lacks weights for: layers\.0\.linear_attn\.A_log$"):
        _llm(tmp_path / "partial")


def test_dummy_weights_of_a_hybrid_keep_its_norms_and_decays_in_range_and_generate(hybrid):
    """load_format="dummy" (the GPU benches' random weights of a real shape): (1 + w) norms at identity, the gated
    norm at 1, A = exp(A_log) in [0.01, 16], the same weights for the same seed, and a greedy run."""
    path, _ = hybrid
    llm = _llm(path, load_format="dummy")
    params = dict(llm.engine.runner.model.named_parameters())
    norms = [p for n, p in params.items() if n.endswith("norm.weight") and "linear_attn" not in n]
    assert norms and all(torch.equal(p, torch.zeros_like(p)) for p in norms)
    gated = [p for n, p in params.items() if n.endswith("linear_attn.norm.weight") or n.endswith("norm_weight")]
    a_log = [p for n, p in params.items() if n.endswith("A_log")]
    assert all(torch.equal(p, torch.ones_like(p)) for p in gated)
    assert a_log and all(((p.exp() >= 0.01 - 1e-6) & (p.exp() <= 16 + 1e-4)).all() for p in a_log)
    again = dict(_llm(path, load_format="dummy").engine.runner.model.named_parameters())
    assert all(torch.equal(params[n], again[n]) for n in params)
    (out,) = llm.generate([list(range(5, 40))], mp.SamplingParams(max_tokens=6, **GREEDY), use_tqdm=False)
    assert len(out.token_ids) == 6 and all(0 <= t < 256 for t in out.token_ids)


@pytest.mark.parametrize("position_free", [True, False], ids=["position_free", "rotated_keys"])
def test_the_hybrid_decodes_through_the_cpu_mirror_as_through_the_paged_op(tmp_path, monkeypatch, position_free):
    """Its attention layers take the decode mirror (decode_mirror.py) as the Llama family's do: the same tokens
    as the paged op, steps served by the mirror, and the same paged cache written. Two attention layers among four,
    so that each must find its own keys in the mirror."""
    path = tmp_path / "two_attention_layers"
    make_hybrid(path, layer_types=["linear_attention", "full_attention"] * 2)
    ours, paged = _llm(path, position_free=position_free), _llm(path, position_free=position_free)
    paged.engine.runner.decode_mirror = None
    mirror = ours.engine.runner.decode_mirror
    served, prepare = [], mirror.prepare
    monkeypatch.setattr(mirror, "prepare", lambda *args: served.append(prepare(*args)) or served[-1])
    prompts, params = _prompts(3, [40, 9, 70], seed=5), mp.SamplingParams(max_tokens=16, **GREEDY)
    outs = ours.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [o.token_ids for o in paged.generate(prompts, params, use_tqdm=False)]
    assert len(served) >= 15 and all(step is not None for step in served)
    assert mirror.k.shape[0] == ours.config.model.num_attention_layers < ours.config.model.num_layers
    assert max_abs_err(ours.engine.runner.kv_cache, paged.engine.runner.kv_cache) < 1e-4


def test_aborting_a_request_that_waits_for_a_state_slot_leaves_the_slots_whole(hybrid):
    """One seat: b waits behind a and is aborted before it ever had a state slot. a still gets transformers' tokens,
    and c then takes the one slot a leaves (a release that gave back b's missing slot put None among the free ones)."""
    path, hf = hybrid
    llm = _llm(path, max_num_seqs=1)
    engine, params = llm.engine, mp.SamplingParams(max_tokens=4, detokenize=False, **GREEDY)
    a_ids, b_ids, c_ids = _prompts(3, [20, 9, 12], seed=5)
    a, b = engine.add_request(a_ids, params), engine.add_request(b_ids, params)
    engine.step()
    assert [r.request_id for r in engine.scheduler.waiting] == [b]
    aborted = engine.abort(b)
    assert (aborted.finish_reason, aborted.token_ids) == ("abort", [])
    c = engine.add_request(c_ids, params)
    outputs = {}
    while engine.has_unfinished():
        outputs.update((o.request_id, o.token_ids) for o in engine.step() if o.finished)
    assert outputs == {a: _hf_greedy(hf, a_ids, 4), c: _hf_greedy(hf, c_ids, 4)}
    assert list(engine.kv.states.free_slots) == [0]
    llm.close()


def test_a_repetition_penalty_and_logprobs_on_the_hybrid_follow_transformers(hybrid):
    """The hybrid family samples through the same sampler: greedy with a repetition penalty gives transformers'
    tokens, resumed from a checkpoint too, and each token's logprob is transformers' log-softmax there."""
    path, hf = hybrid
    llm = _llm(path)
    prompts = _prompts(2, [90, 40], seed=7)
    params = mp.SamplingParams(max_tokens=10, repetition_penalty=1.5, logprobs=2, **GREEDY)
    for _ in range(2):  # the second time from checkpoints
        outs = llm.generate(prompts, params, use_tqdm=False)
        for token_ids, out in zip(prompts, outs, strict=True):
            mask = torch.ones(1, len(token_ids), dtype=torch.long)
            with torch.no_grad():
                hf_out = hf.generate(torch.tensor([token_ids]), attention_mask=mask, max_new_tokens=10,
                                     do_sample=False, repetition_penalty=1.5, eos_token_id=None, pad_token_id=0,
                                     output_logits=True, return_dict_in_generate=True)  # fmt: skip
            assert out.token_ids == hf_out.sequences[0, len(token_ids) :].tolist()
            logprobs = torch.cat(hf_out.logits).float().log_softmax(dim=-1)
            for entry, token, row in zip(out.logprobs, out.token_ids, logprobs, strict=True):
                assert abs(entry[token].logprob - row[token].item()) < 1e-4
                assert set(entry) == {token, *row.topk(2).indices.tolist()}  # the drawn may be the raw 2nd
    assert sum(o.state_report.resume_position > 0 for o in outs) >= 1
    plain = llm.generate(prompts, mp.SamplingParams(max_tokens=10, **GREEDY), use_tqdm=False)
    assert [o.token_ids for o in plain] != [o.token_ids for o in outs], "the penalty changed nothing"


def test_n_completions_on_the_hybrid_each_follow_their_own_state(hybrid):
    """n completions of one prompt run as n requests, each with its own recurrent state slot: greedy, each is
    transformers' tokens; sampled, completion i is the prompt alone with seed + i."""
    path, hf = hybrid
    llm = _llm(path)
    (prompt,) = _prompts(1, [90], seed=11)
    (out,) = llm.generate([prompt], mp.SamplingParams(max_tokens=8, n=3, **GREEDY), use_tqdm=False)
    assert [c.token_ids for c in out.outputs] == [_hf_greedy(hf, prompt, 8)] * 3
    sampled = mp.SamplingParams(max_tokens=8, temperature=1.0, seed=5, n=2, ignore_eos=True)
    (out,) = llm.generate([prompt], sampled, use_tqdm=False)
    for i, completion in enumerate(out.outputs):
        (alone,) = llm.generate([prompt], sampled.child(i), use_tqdm=False)
        assert completion.token_ids == alone.token_ids
    assert out.outputs[0].token_ids != out.outputs[1].token_ids
    assert len(llm.engine.kv.states.free_slots) == llm.config.scheduler.max_num_seqs  # every slot back
    llm.close()


def test_prompt_logprobs_on_the_hybrid_are_transformers_and_resume_from_no_checkpoint(hybrid):
    """Prompt logprobs need every position's logits: the hybrid computes its whole prompt for them, the second time
    too, where a plain request resumes from a checkpoint."""
    path, hf = hybrid
    llm = _llm(path)
    (prompt,) = _prompts(1, [150], seed=13)
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0].float().log_softmax(dim=-1)
    params = mp.SamplingParams(max_tokens=2, prompt_logprobs=2, **GREEDY)
    for _ in range(2):
        (out,) = llm.generate([prompt], params, use_tqdm=False)
        assert out.state_report.resume_position == 0 and out.prompt_logprobs[0] is None
        for position, entry in enumerate(out.prompt_logprobs[1:], start=1):
            token, row = prompt[position], expected[position - 1]
            assert abs(entry[token].logprob - row[token].item()) < 1e-4
            assert set(entry) == {token, *row.topk(2).indices.tolist()}
    (plain,) = llm.generate([prompt], mp.SamplingParams(max_tokens=2, **GREEDY), use_tqdm=False)
    assert plain.state_report.resume_position > 0 and plain.token_ids == out.token_ids
    llm.close()
