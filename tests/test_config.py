"""Config: every LLM keyword goes through EngineConfig.from_options; bad values name themselves."""

import json

import pytest
import torch

from minipic_lite.config import (
    DEFAULT_CUDA_SCHEDULER_STEPS,
    CacheConfig,
    ControlTokens,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
)

LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 128}  # fmt: skip


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    return tmp_path


def test_from_options_applies_the_device_defaults(model_dir):
    model = ModelConfig.from_dir(model_dir)
    cpu = EngineConfig.from_options(model_dir, model, "cpu", ControlTokens())
    cuda = EngineConfig.from_options(model_dir, model, "cuda", ControlTokens())
    assert (cpu.dtype, cpu.scheduler.num_scheduler_steps) == ("float32", 1)
    assert (cuda.dtype, cuda.scheduler.num_scheduler_steps) == ("bfloat16", DEFAULT_CUDA_SCHEDULER_STEPS)
    assert (cpu.scheduler.async_scheduling, cuda.scheduler.async_scheduling) == (False, True)
    forced = EngineConfig.from_options(model_dir, model, "cpu", ControlTokens(), async_scheduling=True)
    assert forced.scheduler.async_scheduling
    assert cpu.scheduler.max_model_len == 128 and model.head_dim == 8 and model.num_kv_heads == 2
    small = EngineConfig.from_options(model_dir, model, "cpu", ControlTokens(), max_model_len=64, block_size=8)
    assert small.scheduler.max_model_len == 64 and small.cache.block_size == 8
    assert cpu.hash_namespace != small.hash_namespace  # caches of other block sizes never alias


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dtype": "float64"}, "dtype"),
        ({"load_format": "pickle"}, "load_format"),
        ({"block_size": 12}, "block_size"),
        ({"memory_utilization": 0.0}, "memory_utilization"),
        ({"cpu_kv_cache_gib": -1.0}, "cpu_kv_cache_gib"),
        ({"num_blocks": 0}, "num_blocks"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"num_scheduler_steps": 0}, "num_scheduler_steps"),
        ({"max_model_len": 0}, "max_model_len must be a positive integer, got 0"),
        ({"max_model_len": -5}, "max_model_len must be a positive integer, got -5"),
        ({"max_num_batched_tokens": 1.5}, "max_num_batched_tokens must be a positive integer, got 1.5"),
        ({"max_model_len": 129}, "max_model_len=129 is past the model's 128 positions"),
    ],
)
def test_bad_options_are_named(model_dir, options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_options(model_dir, ModelConfig.from_dir(model_dir), "cpu", ControlTokens(), **options)


def test_unknown_option_is_a_type_error(model_dir):
    with pytest.raises(TypeError, match="max_num_tokens"):
        EngineConfig.from_options(model_dir, ModelConfig.from_dir(model_dir), "cpu", ControlTokens(), max_num_tokens=1)


def test_an_unknown_option_names_the_nearest_known_one(model_dir):
    with pytest.raises(TypeError, match="'gpu_memory_utilization' \\(did you mean 'memory_utilization'\\?\\)"):
        EngineConfig.from_options(model_dir, ModelConfig.from_dir(model_dir), "cpu", ControlTokens(),
                                  gpu_memory_utilization=0.9)  # fmt: skip
    with pytest.raises(TypeError, match="unknown option 'xyzzy': the options"):
        EngineConfig.from_options(model_dir, ModelConfig.from_dir(model_dir), "cpu", ControlTokens(), xyzzy=1)


def test_float16_on_the_cpu_warns_that_it_is_slow(model_dir, caplog):
    model = ModelConfig.from_dir(model_dir)
    for device, dtype in (("cpu", "float32"), ("cpu", "bfloat16"), ("cuda", "float16"), ("cpu", "float16")):
        EngineConfig.from_options(model_dir, model, device, ControlTokens(), dtype)
    assert [r.message for r in caplog.records] == [
        "float16 on the CPU has no fast kernels: many times slower than float32 or bfloat16"
    ]


def test_heads_must_group(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "num_key_value_heads": 3}))
    with pytest.raises(ValueError, match="not a multiple of num_kv_heads=3"):
        ModelConfig.from_dir(tmp_path)


def test_unsupported_family_is_refused_by_the_registry():
    from minipic_lite.models.registry import MODEL_REGISTRY, model_class

    assert model_class("qwen3") is MODEL_REGISTRY["llama"]
    with pytest.raises(ValueError, match="unsupported model_type 'mamba'"):
        model_class("mamba")
    assert CacheConfig().block_size == 16 and SchedulerConfig().num_scheduler_steps == 1


@pytest.mark.parametrize("turn", [-1, True, 1.0, "1"])
def test_a_bad_checkpoint_turn_start_id_fails_naming_it(turn):
    with pytest.raises(ValueError, match="checkpoint_turn_start_id must be a token id >= 0 or None"):
        CacheConfig(checkpoint_turn_start_id=turn)


def test_kernels_compile_on_cuda_unless_eager_or_turned_off(model_dir, monkeypatch):
    from minipic_lite.model_runner import compiles_kernels

    model = ModelConfig.from_dir(model_dir)
    cpu = EngineConfig.from_options(model_dir, model, "cpu", ControlTokens())
    cuda = EngineConfig.from_options(model_dir, model, "cuda", ControlTokens())
    eager = EngineConfig.from_options(model_dir, model, "cuda", ControlTokens(), enforce_eager=True)
    assert (compiles_kernels(cpu), compiles_kernels(cuda), compiles_kernels(eager)) == (False, True, False)
    monkeypatch.setenv("MINIPIC_COMPILE", "0")
    assert not compiles_kernels(cuda)


@pytest.mark.parametrize(
    "rope",
    [{"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, {"rope_parameters": {"rope_type": "yarn"}}],
)
def test_a_scaled_rope_is_refused_naming_its_type(tmp_path, rope):
    """Llama 3.1's and YaRN's scaled RoPE are not implemented: a clear error at load, not wrong logits later."""
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **rope}))
    kind = next(iter(rope.values()))["rope_type"]
    with pytest.raises(ValueError, match=f"unsupported rope_type '{kind}': only plain RoPE is implemented"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "rope_parameters": {"rope_type": "default"}}))
    assert ModelConfig.from_dir(tmp_path).max_position == 128


@pytest.mark.parametrize(("use", "expected"), [(True, 64), (False, 128)])
def test_a_sliding_window_bounds_the_context_to_the_window(tmp_path, use, expected):
    """No sliding-window attention here: a model whose window is in use serves prompts up to the window (where full
    attention is the same thing) and refuses longer ones by name; Qwen2's unused window (use_sliding_window false)
    leaves its positions as they are."""
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "sliding_window": 64, "use_sliding_window": use}))
    model = ModelConfig.from_dir(tmp_path)
    assert model.max_position == expected
    with pytest.raises(ValueError, match=f"max_model_len={expected + 1} is past the model's {expected} positions"):
        EngineConfig.from_options(tmp_path, model, "cpu", ControlTokens(), max_model_len=expected + 1)


def test_layer_types_must_name_every_layer():
    fields = dict(architecture="qwen3_5_text", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=1e4, max_position=128,
                  tie_word_embeddings=False)  # fmt: skip
    with pytest.raises(ValueError, match="layer_types names 3 layers, the model has 2"):
        ModelConfig(**fields, layer_types=("linear_attention",) * 2 + ("full_attention",))
    assert ModelConfig(**fields, layer_types=("linear_attention", "full_attention")).num_attention_layers == 1


@pytest.mark.parametrize("options", [{"position_free": True}, {"position_free": False, "host_cache_gib": 1.0}])
def test_the_rerotate_baseline_needs_rotated_keys_and_no_host_tier(options):
    with pytest.raises(ValueError, match="rerotate_spans .* needs position_free=False and no host tier"):
        CacheConfig(rerotate_spans=True, **options)
    assert CacheConfig(rerotate_spans=True, position_free=False).rerotate_spans


@pytest.mark.parametrize(
    ("dtype", "device", "expected"),
    [
        (None, "cpu", "float32"),
        ("auto", "cpu", "float32"),  # vLLM's default spelling: the device's
        ("auto", "cuda", "bfloat16"),
        (torch.bfloat16, "cpu", "bfloat16"),  # LLM(dtype=torch.float32) was refused until stop 63
        (torch.float32, "cuda", "float32"),
        ("half", "cuda", "float16"),
        ("float", "cpu", "float32"),
        ("bfloat16", "cpu", "bfloat16"),
    ],
)
def test_dtype_takes_names_torch_dtypes_and_vllms_spellings(model_dir, dtype, device, expected):
    config = EngineConfig.from_options(model_dir, ModelConfig.from_dir(model_dir), device, ControlTokens(), dtype)
    assert config.dtype == expected


@pytest.mark.parametrize(("dtype", "named"), [(torch.float64, "'float64'"), ("fp8", "'fp8'"), (16, "16")])
def test_a_dtype_the_engine_has_no_kernels_for_is_named(model_dir, dtype, named):
    with pytest.raises(ValueError, match=f"dtype must be one of float32, bfloat16, float16 .*got {named}$"):
        EngineConfig.from_options(model_dir, ModelConfig.from_dir(model_dir), "cpu", ControlTokens(), dtype)
