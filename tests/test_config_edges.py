"""Edges of the config (config.py) that test_config leaves open, no model: what a Llama config.json that leaves a
field out means (transformers' LlamaConfig defaults are the oracle: one kv head per head, rms_norm_eps 1e-6,
untied embeddings), the rope fields of `rope_parameters`, a scaled RoPE under the legacy `type` key, a list of eos
ids, a top-level eos beside a `text_config`, a sliding window wider than the context, Qwen3.5's default conv kernel,
layer_types that name too few layers, a config.json that is not an object or names no model_type, the inclusive ends
of each option's range and the first values past them, the defaults the README documents, what the hash namespace
and a cuda:N device mean, control tokens of the wrong type or outside the vocabulary, the smallest block size and
cache, and memory sizes below 1 GiB or below 0."""

import json
from pathlib import Path

import pytest

from minipic_lite.config import (
    CacheConfig,
    ControlTokens,
    EngineConfig,
    LinearAttentionConfig,
    ModelConfig,
    SchedulerConfig,
)

LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 128}  # fmt: skip


def test_fields_left_out_take_transformers_defaults():
    from transformers import LlamaConfig

    hf, cfg = LlamaConfig(), ModelConfig._from_json(LLAMA)
    assert cfg.num_kv_heads == cfg.num_heads == 4  # no num_key_value_heads: multi-head attention
    assert (cfg.rms_norm_eps, cfg.rope_theta) == (hf.rms_norm_eps, hf.rope_parameters["rope_theta"]) == (1e-6, 1e4)
    assert cfg.tie_word_embeddings is hf.tie_word_embeddings is False
    assert cfg.eos_token_ids == () and cfg.max_position == 128


@pytest.mark.parametrize(("model_type", "bias", "qk_norm"), [("llama", False, False), ("qwen2", True, False),
                                                          ("qwen3", False, True)])  # fmt: skip
def test_a_config_json_naming_no_attention_bias_takes_its_familys_layout(model_type, bias, qk_norm):
    """With no attention_bias in config.json, Qwen2's q/k/v projections have biases (transformers builds them so) and
    Llama's and Qwen3's have none; Qwen3 alone normalizes q and k per head."""
    cfg = ModelConfig._from_json({**LLAMA, "model_type": model_type})
    assert (cfg.attention_bias, cfg.qk_norm) == (bias, qk_norm)


def test_rope_parameters_eos_lists_and_a_text_configs_top_level_eos_are_read():
    rope = {"rope_type": None, "rope_theta": 500000.0}  # no type named: plain RoPE
    cfg = ModelConfig._from_json({**LLAMA, "rope_parameters": rope, "eos_token_id": [2, 7]})
    assert (cfg.rope_theta, cfg.eos_token_ids) == (500000.0, (2, 7))
    nested = ModelConfig._from_json({"model_type": "llama", "eos_token_id": 5, "text_config": LLAMA})
    assert nested.eos_token_ids == (5,) and nested.hidden_size == 32


@pytest.mark.parametrize(
    "rope",
    [{"type": "linear", "factor": 2.0}, {"type": "dynamic", "factor": 2.0},
     {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}],
    ids=["linear", "dynamic", "yarn"],
)  # fmt: skip
def test_a_scaled_rope_under_the_legacy_type_key_is_refused(rope):
    """Older configs name the scaling "type" (Llama 2 fine-tunes, Qwen2.5's long-context yarn); transformers reads it
    when rope_type is absent: a plain-RoPE run of linear or yarn gives other logits. (dynamic equals plain RoPE within
    the original window, to which the engine caps the context; refused as rope_type "dynamic" always was.)"""
    with pytest.raises(ValueError, match=f"unsupported rope_type '{rope['type']}': only plain RoPE is implemented"):
        ModelConfig._from_json({**LLAMA, "rope_scaling": rope})


def test_the_legacy_type_key_naming_default_rope_is_read():
    assert ModelConfig._from_json({**LLAMA, "rope_scaling": {"type": "default"}}).rope_theta == 1e4


def test_a_sliding_window_wider_than_the_context_leaves_the_context():
    assert ModelConfig._from_json({**LLAMA, "sliding_window": 4096}).max_position == 128


def test_qwen3_5s_conv_kernel_defaults_to_transformers():
    from transformers import Qwen3_5TextConfig

    shapes = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
              "linear_value_head_dim": 16}  # fmt: skip
    assert LinearAttentionConfig.from_hf(shapes).conv_kernel == Qwen3_5TextConfig().linear_conv_kernel_dim == 4


def test_layer_types_that_name_too_few_layers_are_refused():
    cfg = ModelConfig._from_json(LLAMA)
    fields = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
    with pytest.raises(ValueError, match="layer_types names 1 layers, the model has 2"):
        ModelConfig(**{**fields, "layer_types": ("full_attention",)})


def test_a_config_json_that_is_no_object_or_names_no_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="config.json holds a list, not a JSON object"):
        ModelConfig.read_json(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 64}))
    assert ModelConfig.model_type(tmp_path) == "?"


def test_the_inclusive_ends_of_the_options():
    assert CacheConfig(memory_utilization=1.0).memory_utilization == 1.0  # (0, 1]
    cache = CacheConfig(checkpoint_turn_start_id=0, state_cache_gib=0.0, checkpoints_per_entry=0)  # 0: none of them
    assert (cache.checkpoint_turn_start_id, cache.state_cache_gib, cache.checkpoints_per_entry) == (0, 0.0, 0)
    with pytest.raises(ValueError, match="state_eviction must be one of lru, flops, got ''"):
        CacheConfig(state_eviction="")
    assert SchedulerConfig(span_ahead_tokens=0).span_ahead_tokens == 0
    with pytest.raises(ValueError, match="span_ahead_tokens must be None or an integer >= 0, got True"):
        SchedulerConfig(span_ahead_tokens=True)
    with pytest.raises(ValueError, match="max_num_seqs must be a positive integer, got True"):
        SchedulerConfig(max_num_seqs=True)
    with pytest.raises(ValueError, match="async_scheduling must be True or False, got 'isps'"):
        SchedulerConfig(4, 24, 1024, 1, "isps")  # a span policy in async_scheduling's position


def test_caches_of_other_dtypes_or_of_the_rerotate_baseline_never_alias():
    model = ModelConfig._from_json(LLAMA)
    plain = EngineConfig(Path("m"), model, CacheConfig(position_free=False))
    assert (
        plain.hash_namespace
        != EngineConfig(Path("m"), model, CacheConfig(position_free=False), dtype="bfloat16").hash_namespace
    )
    rerotate = EngineConfig(Path("m"), model, CacheConfig(position_free=False, rerotate_spans=True))
    assert plain.hash_namespace != rerotate.hash_namespace


def test_float16_warns_on_the_cpu_only(caplog):
    """test_config's check sees one warning over four devices and dtypes: not which of them gave it."""
    model = ModelConfig._from_json(LLAMA)
    EngineConfig.from_options(Path("m"), model, "cuda", ControlTokens(), "float16")
    assert caplog.records == []
    EngineConfig.from_options(Path("m"), model, "cpu", ControlTokens(), "float16")
    assert [r.message for r in caplog.records] == [
        "float16 on the CPU has no fast kernels: many times slower than float32 or bfloat16"
    ]


def test_an_unknown_option_names_a_known_one_that_is_only_near(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    model = ModelConfig.from_dir(tmp_path)
    with pytest.raises(TypeError, match=r"unknown option 'max_seqs' \(did you mean 'max_num_seqs'\?\)"):
        EngineConfig.from_options(tmp_path, model, "cpu", ControlTokens(), max_seqs=8)


def test_the_defaults_the_readme_documents():
    """README: block_size 16, memory_utilization 0.85, a 2,048-token step budget, 64 sequences, a 2 GiB CPU cache cap,
    the decode mirror on, `inline` spans, 8 decode steps a burst on CUDA (1 on the CPU), and the hybrid knobs dp / 4 /
    balanced / 0.5 GiB / lru; caching is position-free with prefix caching on."""
    cache, sched = CacheConfig(), SchedulerConfig()
    assert (cache.block_size, cache.memory_utilization, cache.cpu_kv_cache_gib) == (16, 0.85, 2.0)
    assert cache.position_free and cache.enable_prefix_caching and not cache.rerotate_spans
    assert (cache.checkpoint_policy, cache.checkpoints_per_entry, cache.checkpoint_prior, cache.state_cache_gib) == (
        "dp", 4, "balanced", 0.5,
    )  # fmt: skip
    assert (sched.max_num_batched_tokens, sched.span_policy, sched.span_ahead_tokens) == (2048, "inline", None)
    assert (sched.max_num_seqs, cache.cpu_decode_mirror, cache.state_eviction) == (64, True, "lru")
    model = ModelConfig._from_json(LLAMA)
    steps = [EngineConfig.from_options(Path("m"), model, d, ControlTokens()).scheduler.num_scheduler_steps
             for d in ("cuda", "cpu")]  # fmt: skip
    assert steps == [8, 1]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: CacheConfig(block_size=0), "block_size must be a positive power of two, got 0"),
        (lambda: CacheConfig(memory_utilization=1.5), r"memory_utilization must be in \(0, 1\], got 1.5"),
        (lambda: CacheConfig(cpu_kv_cache_gib=0.0), "cpu_kv_cache_gib must be positive, got 0.0"),
        (lambda: CacheConfig(checkpoints_per_entry=-1), "checkpoints_per_entry must be an integer >= 0, got -1"),
        (lambda: CacheConfig(checkpoints_per_entry=True), "checkpoints_per_entry must be an integer >= 0, got True"),
        (lambda: SchedulerConfig(span_ahead_tokens=-1), "span_ahead_tokens must be None or an integer >= 0, got -1"),
    ],
)
def test_the_first_value_past_each_end_of_an_option_is_refused_naming_it(make, message):
    """Just outside each range (0 blocks, more than all memory, no CPU cache, -1, a bool for a count) fails by name."""
    with pytest.raises(ValueError, match=message):
        make()


def test_caches_of_other_models_or_of_rotated_keys_never_alias():
    """The hash namespace names the model directory and whether keys are position-free."""
    model = ModelConfig._from_json(LLAMA)
    free = EngineConfig(Path("a"), model).hash_namespace
    assert free != EngineConfig(Path("b"), model).hash_namespace
    assert free != EngineConfig(Path("a"), model, CacheConfig(position_free=False)).hash_namespace


def test_a_numbered_cuda_device_takes_the_cuda_defaults():
    """device="cuda:1" is a CUDA device: bfloat16, bursts of 8 decode steps and async scheduling, as "cuda"."""
    config = EngineConfig.from_options(Path("m"), ModelConfig._from_json(LLAMA), "cuda:1", ControlTokens())
    assert (config.dtype, config.scheduler.num_scheduler_steps, config.scheduler.async_scheduling) == (
        "bfloat16", 8, True,
    )  # fmt: skip


def test_a_misspelt_dtype_is_named_as_the_dtype_it_is_near():
    with pytest.raises(TypeError, match=r"unknown option 'dtpye' \(did you mean 'dtype'\?\)"):
        EngineConfig.from_options(Path("m"), ModelConfig._from_json(LLAMA), "cpu", ControlTokens(), dtpye="float32")


def test_a_text_configs_own_eos_is_kept_where_the_top_level_names_none():
    """Qwen3.5's layout may carry eos_token_id only inside text_config: it is read from there."""
    nested = ModelConfig._from_json({"model_type": "llama", "text_config": {**LLAMA, "eos_token_id": 9}})
    assert nested.eos_token_ids == (9,)


def test_a_sliding_window_is_in_use_unless_the_config_says_otherwise():
    """Mistral's config.json names sliding_window and no use_sliding_window: the window bounds the context."""
    assert ModelConfig._from_json({**LLAMA, "sliding_window": 64}).max_position == 64


def test_a_hybrid_config_needs_layer_types_and_only_linear_layers_make_a_model_hybrid():
    linear = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
              "linear_value_head_dim": 8}  # fmt: skip
    with pytest.raises(ValueError, match="a qwen3_5_text config.json needs layer_types"):
        ModelConfig._from_json({**LLAMA, **linear, "model_type": "qwen3_5_text"})
    cfg = ModelConfig._from_json(LLAMA)
    fields = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
    assert not ModelConfig(**{**fields, "layer_types": ("full_attention",) * 2}).is_hybrid
    assert ModelConfig(**{**fields, "layer_types": ("linear_attention", "full_attention")}).is_hybrid


def test_a_llama_config_naming_no_max_position_takes_transformers_default():
    """LlamaConfig's max_position_embeddings defaults to 2048: a config.json that leaves it out gets the same."""
    fields_out = {k: v for k, v in LLAMA.items() if k != "max_position_embeddings"}
    assert ModelConfig._from_json(fields_out).max_position == 2048


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"block_size": 16.0}, "block_size must be a positive power of two, got 16.0"),
        ({"block_size": True}, "block_size must be a positive power of two, got True"),
        ({"num_blocks": 2.5}, "num_blocks must be None or a positive integer, got 2.5"),
        ({"num_blocks": True}, "num_blocks must be None or a positive integer, got True"),
    ],
)
def test_block_counts_that_are_not_integers_are_refused_by_name(options, message):
    """A float or a bool is no block count: refused with the option's name, not a TypeError from inside."""
    with pytest.raises(ValueError, match=message):
        CacheConfig(**options)


def test_a_misspelt_llm_keyword_is_named_as_the_keyword_it_is_near():
    """LLM(...)'s own arguments are among the names a misspelt option is matched against."""
    with pytest.raises(TypeError, match=r"unknown option 'control_token' \(did you mean 'control_tokens'\?\)"):
        EngineConfig.from_options(Path("m"), ModelConfig._from_json(LLAMA), "cpu", ControlTokens(), control_token=1)


def test_control_tokens_are_a_controltokens_of_ids_inside_the_vocabulary():
    """`LLM(control_tokens={...})` was taken and failed at the first prompt with "'dict' object has no attribute
    'pdep_id'"; an id outside the vocabulary failed only once a composed prompt carried it."""
    model = ModelConfig._from_json(LLAMA)  # vocab_size 64
    with pytest.raises(TypeError, match="control_tokens must be a ControlTokens, got dict"):
        EngineConfig(Path("m"), model, control={"ssep_id": 1})
    with pytest.raises(ValueError, match=r"control_tokens.pad_id must be a token id in \[0, 64\), got 64"):
        EngineConfig(Path("m"), model, control=ControlTokens(ssep_id=1, pdep_id=2, pad_id=64))
    with pytest.raises(ValueError, match=r"control_tokens.ssep_id must be a token id in \[0, 64\), got '1'"):
        EngineConfig(Path("m"), model, control=ControlTokens(ssep_id="1"))
    assert EngineConfig(Path("m"), model, control=ControlTokens(ssep_id=0, pdep_id=63)).control.pdep_id == 63


def test_one_is_the_smallest_block_size_and_sizes_between_powers_of_two_are_refused():
    """A block of one token is a power of two (2**0) like 16; 6 and 3 are not."""
    assert CacheConfig(block_size=1).block_size == 1
    for bad in (6, 3):
        with pytest.raises(ValueError, match=f"block_size must be a positive power of two, got {bad}"):
            CacheConfig(block_size=bad)


def test_memory_sizes_take_fractions_of_a_gib_and_refuse_negative_ones():
    """A CPU cache cap of half a GiB is positive, so taken; a host tier or checkpoint store of -0.5 GiB is no size."""
    assert CacheConfig(cpu_kv_cache_gib=0.5).cpu_kv_cache_gib == 0.5
    with pytest.raises(ValueError, match=r"host_cache_gib must be >= 0 \(0: no host tier\), got -0.5"):
        CacheConfig(host_cache_gib=-0.5)
    with pytest.raises(ValueError, match=r"state_cache_gib must be >= 0 \(0: no checkpoints\), got -0.5"):
        CacheConfig(state_cache_gib=-0.5)


def test_a_cache_of_one_block_is_taken():
    """num_blocks is None (sized from memory) or a positive count: one block is the fewest."""
    assert CacheConfig(num_blocks=1).num_blocks == 1


@pytest.mark.parametrize("name", ["memory_utilization", "cpu_kv_cache_gib", "host_cache_gib", "state_cache_gib"])
def test_a_memory_size_that_is_not_a_number_is_refused_naming_it(name):
    """NaN compares false with everything: each check is written so that it fails NaN too (not a range it passes)."""
    with pytest.raises(ValueError, match=rf"^{name} must be .*, got nan$"):
        CacheConfig(**{name: float("nan")})
