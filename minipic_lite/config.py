"""Every knob of the engine, in frozen dataclasses, with the defaults named once."""

from __future__ import annotations

import difflib
import json
import logging
from dataclasses import dataclass, field, fields
from pathlib import Path

logger = logging.getLogger(__name__)

GIB = 1 << 30
DEFAULT_BLOCK_SIZE = 16
LLAMA_MAX_POSITION = 2048  # a config.json naming no max_position_embeddings: transformers' LlamaConfig default
DEFAULT_MAX_NUM_SEQS = 64
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
# Fraction of the GPU's total memory the engine may fill: the KV cache gets what is left of it after the weights,
# a warm-up forward's peak and other processes (model_runner.py). On the CPU it caps the cache at this fraction of
# MemAvailable.
DEFAULT_MEMORY_UTILIZATION = 0.85
# On the CPU the cache is also capped, so a laptop run does not reserve most of its RAM.
DEFAULT_CPU_KV_CACHE_GIB = 2.0
# Steps captured as CUDA graphs (cuda_graphs.py), padded up to the next bucket: decode steps per batch size, and
# prefill or mixed steps with few new tokens (a prompt whose documents are cached) per (sequences, tokens) with at
# most CUDA_GRAPH_MAX_TOKENS_PER_SEQ tokens per sequence on average.
CUDA_GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
# NOTE: 24 because cuBLAS reads the projections faster at 17-24 rows than padded to 32 (its 24-row tiles): H200,
# Llama-3-8B shapes, a layer's four at 17 rows 126.1 us against 129.2 at 32 (bench/gpu_small_kernels.py, next58)
CUDA_GRAPH_TOKEN_SIZES = (16, 24, 32, 64, 128, 256, 512)
CUDA_GRAPH_MAX_TOKENS_PER_SEQ = 32
# The copy-rerotate baseline turns at most this many blocks' keys at once: its float32 temporaries are a few times
# blocks x layers x block_size x kv_heads x head_dim x 4 bytes (Llama-3-8B: ~0.5 GB each at 256 blocks of 16).
REROTATE_BATCH_BLOCKS = 256
# Decode steps run back to back on a GPU between two visits of the scheduler (one host sync per burst):
# the host's scheduling, input building and output handling then stop leaving the GPU idle every step.
DEFAULT_CUDA_SCHEDULER_STEPS = 8
# An LLM dropped or left at the interpreter's exit waits this long for its loop's current step, then leaves the step
# to end on its own (the loop thread is a daemon): a stuck step cannot hang the process at exit.
LOOP_EXIT_WAIT_S = 10.0
# Hash chains of the runs of span prompts remembered by content (spans.SpanHashMemo), so that a cached span is not
# hashed block by block again in every prompt that uses it: at most this many blocks' hashes and tokens
# (~200 bytes each: ~13 MB).
SPAN_HASH_MEMO_BLOCKS = 1 << 16

DTYPES = ("float32", "bfloat16", "float16")
SPAN_POLICIES = ("inline", "isps", "barrier")
LOAD_FORMATS = ("auto", "dummy")  # "dummy": random weights of the model's shape (vLLM's name; benchmarks)

# Hybrid models (models/qwen3_5.py): the layer kinds a `layer_types` list may name, and the families that read it.
LAYER_TYPES = ("full_attention", "linear_attention")
HYBRID_ARCHITECTURES = ("qwen3_5", "qwen3_5_text")
# Recurrent-state checkpoints (state_cache.py): memory of the store, checkpoints planned per prompt, the policy
# (checkpoints.POLICIES plus "last"), the policy the planner uses before it has seen any traffic, eviction.
DEFAULT_STATE_CACHE_GIB = 0.5
DEFAULT_CHECKPOINTS_PER_ENTRY = 4
DEFAULT_CHECKPOINT_POLICY = "dp"
DEFAULT_CHECKPOINT_PRIOR = "balanced"
# The chat template's turn-start token (ChatML: SmolLM2, Qwen): `dp`'s prior moves its plan up to where a prompt's
# turns start (checkpoints/turns.py); LLM(...) takes its id from the tokenizer where the vocabulary has it.
CHAT_TURN_START_TOKEN = "<|im_start|>"
STATE_EVICTIONS = ("lru", "flops")

# Control tokens of SmolLM2's vocabulary that chat never uses (StarCoder repository-metadata tokens).
SMOLLM2_CONTROL_TOKENS = {"ssep": "<repo_name>", "pdep": "<reponame>", "pad": "<file_sep>"}


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many blocks of `b` hold `a` tokens."""
    return -(-a // b)


@dataclass(frozen=True)
class LinearAttentionConfig:
    """Gated DeltaNet layers of a hybrid model: state [v_heads, k_head_dim, v_head_dim] + a conv window."""

    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.k_head_dim + self.num_v_heads * self.v_head_dim

    @classmethod
    def from_hf(cls, cfg: dict) -> LinearAttentionConfig:
        return cls(cfg["linear_num_key_heads"], cfg["linear_num_value_heads"], cfg["linear_key_head_dim"],
                   cfg["linear_value_head_dim"], cfg.get("linear_conv_kernel_dim", 4))  # fmt: skip


@dataclass(frozen=True)
class ModelConfig:
    """What the model code needs from a Hugging Face config.json (Llama family)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    qk_norm: bool = False
    eos_token_ids: tuple[int, ...] = ()
    rotary_dim: int | None = None
    layer_types: tuple[str, ...] = ()  # hybrid models: one of LAYER_TYPES per layer; () = all full attention
    linear: LinearAttentionConfig | None = None  # hybrid models: the linear-attention layers' shapes

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if unknown:
            raise ValueError(f"unsupported layer types {unknown} in layer_types: this engine runs {LAYER_TYPES}")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types names {len(self.layer_types)} layers, the model has {self.num_layers}")

    @property
    def is_hybrid(self) -> bool:
        return "linear_attention" in self.layer_types

    @property
    def num_attention_layers(self) -> int:
        """Layers with paged KV (a hybrid's linear-attention layers keep recurrent state instead)."""
        return self.layer_types.count("full_attention") if self.layer_types else self.num_layers

    @property
    def rope_dim(self) -> int:
        return self.rotary_dim or self.head_dim

    @staticmethod
    def read_json(model_dir: Path) -> dict:
        """The directory's config.json as a dict; a file that is not a JSON object is a ValueError naming it."""
        path = Path(model_dir) / "config.json"
        try:
            cfg = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"{path} holds a {type(cfg).__name__}, not a JSON object")
        return cfg

    @classmethod
    def model_type(cls, model_dir: Path) -> str:
        """config.json's model_type ("?" where it names none): models/registry.py says which ones run."""
        return str(cls.read_json(model_dir).get("model_type", "?"))

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelConfig:
        cfg = cls.read_json(model_dir)
        try:
            return cls._from_json(cfg)
        except KeyError as e:
            raise ValueError(f"{Path(model_dir) / 'config.json'} lacks {e.args[0]!r}") from None

    @classmethod
    def _from_json(cls, cfg: dict) -> ModelConfig:
        arch = cfg.get("model_type", "?")  # NOTE: models/registry.py says which ones run
        if isinstance(cfg.get("text_config"), dict):  # the released Qwen3.5 layout: the text part of it
            cfg = {"eos_token_id": cfg.get("eos_token_id"), **cfg["text_config"]}
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        # NOTE: older configs spell the key "type" (Llama 2's linear and dynamic scaling, Qwen2.5's long-context
        # yarn); transformers reads rope_type first, then type, and so must we.
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in ("default", None):
            raise ValueError(f"unsupported rope_type {kind!r}: only plain RoPE is implemented")
        eos = cfg.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        max_position = cfg.get("max_position_embeddings", LLAMA_MAX_POSITION)
        if cfg.get("sliding_window") and cfg.get("use_sliding_window", True):
            # NOTE: no sliding-window attention here; within the window full attention is the same thing.
            max_position = min(max_position, cfg["sliding_window"])
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or hidden // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 10000.0)),
            max_position=max_position,
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", arch == "qwen2"),
            qk_norm=arch == "qwen3",
            eos_token_ids=eos,
            **_hybrid_fields(cfg, arch, rope),
        )


def _hybrid_fields(cfg: dict, arch: str, rope: dict) -> dict:
    """layer_types, the linear-attention shapes and partial rotary of a hybrid family's config.json."""
    if arch not in HYBRID_ARCHITECTURES:
        return {}
    layer_types = tuple(cfg.get("layer_types") or ())
    if not layer_types:
        raise ValueError(f"a {arch} config.json needs layer_types (its linear/full attention layers)")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    factor = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    return {"layer_types": layer_types, "linear": LinearAttentionConfig.from_hf(cfg),
            "rotary_dim": int(head_dim * factor)}  # fmt: skip


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = DEFAULT_BLOCK_SIZE
    num_blocks: int | None = None  # None: sized from free memory
    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION
    cpu_kv_cache_gib: float = DEFAULT_CPU_KV_CACHE_GIB
    position_free: bool = True
    enable_prefix_caching: bool = True
    # The copy-rerotate baseline (position_free=False only): span markers take effect, and a cached span hit at
    # another offset is copied to a fresh block with its keys rotated by the offset difference.
    rerotate_spans: bool = False
    # A host tier for blocks evicted from the device cache (host_tier.py); 0: none.
    host_cache_gib: float = 0.0
    # CPU: decode steps attend over contiguous copies of the running requests' rotated keys and values
    # (decode_mirror.py), at most cpu_kv_cache_gib of them; False: the op reads the paged cache every step.
    cpu_decode_mirror: bool = True
    # hybrid models (state_cache.py): memory of the recurrent-state checkpoint store, and its planning
    state_cache_gib: float = DEFAULT_STATE_CACHE_GIB
    checkpoint_policy: str = DEFAULT_CHECKPOINT_POLICY
    checkpoints_per_entry: int = DEFAULT_CHECKPOINTS_PER_ENTRY
    checkpoint_prior: str = DEFAULT_CHECKPOINT_PRIOR  # what `dp` plans with before it has seen traffic
    checkpoint_turn_start_id: int | None = None  # CHAT_TURN_START_TOKEN's id; None: the prior ignores chat turns
    state_eviction: str = "lru"

    def __post_init__(self):
        if not _is_int(self.block_size) or self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a positive power of two, got {self.block_size}")
        if self.num_blocks is not None and (not _is_int(self.num_blocks) or self.num_blocks <= 0):
            raise ValueError(f"num_blocks must be None or a positive integer, got {self.num_blocks!r}")
        if not 0.0 < self.memory_utilization <= 1.0:
            raise ValueError(f"memory_utilization must be in (0, 1], got {self.memory_utilization}")
        if not self.cpu_kv_cache_gib > 0:
            raise ValueError(f"cpu_kv_cache_gib must be positive, got {self.cpu_kv_cache_gib}")
        if not self.host_cache_gib >= 0:
            raise ValueError(f"host_cache_gib must be >= 0 (0: no host tier), got {self.host_cache_gib}")
        if self.rerotate_spans and (self.position_free or self.host_cache_gib):
            raise ValueError("rerotate_spans (the rotated-key baseline) needs position_free=False and no host tier")
        self._check_checkpoints()

    def _check_checkpoints(self) -> None:
        from minipic_lite.checkpoints import POLICIES

        for name in ("checkpoint_policy", "checkpoint_prior"):
            if getattr(self, name) not in POLICIES:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose from {', '.join(sorted(POLICIES))}")
        if self.checkpoint_prior == "dp":
            raise ValueError("checkpoint_prior must be a policy that needs no traffic, not 'dp'")
        turn = self.checkpoint_turn_start_id
        if turn is not None and (isinstance(turn, bool) or not isinstance(turn, int) or turn < 0):
            raise ValueError(f"checkpoint_turn_start_id must be a token id >= 0 or None, got {turn!r}")
        if not self.state_cache_gib >= 0:
            raise ValueError(f"state_cache_gib must be >= 0 (0: no checkpoints), got {self.state_cache_gib}")
        if isinstance(self.checkpoints_per_entry, bool) or not isinstance(self.checkpoints_per_entry, int) \
                or self.checkpoints_per_entry < 0:  # fmt: skip
            raise ValueError(f"checkpoints_per_entry must be an integer >= 0, got {self.checkpoints_per_entry!r}")
        if self.state_eviction not in STATE_EVICTIONS:
            raise ValueError(f"state_eviction must be one of {', '.join(STATE_EVICTIONS)}, got {self.state_eviction!r}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_model_len: int = 8192
    # Decode steps per scheduler visit when every scheduled request decodes and none waits (vLLM's
    # multi-step scheduling); tokens sampled past a stop inside a burst are dropped.
    num_scheduler_steps: int = 1
    # Plan and queue the next decode burst while the last one runs, before its tokens are read (as vLLM's async
    # scheduling): the host's work between bursts overlaps the device's. On by default on CUDA; the CPU runs a
    # step as it is queued, so there it would only add work (tokens computed past a stop).
    async_scheduling: bool = False
    # When SSEP spans of a waiting prompt are computed: "inline", "isps" or "barrier" (scheduler.py).
    span_policy: str = "inline"
    # isps: at most this many tokens of span prefills computed ahead in a step where other requests run; None: the
    # budget they leave (scheduler.py says why that is the default)
    span_ahead_tokens: int | None = None

    def __post_init__(self):
        if self.span_policy not in SPAN_POLICIES:
            raise ValueError(f"span_policy must be one of {', '.join(SPAN_POLICIES)}, got {self.span_policy!r}")
        for name in ("num_scheduler_steps", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.async_scheduling, bool):  # NOTE: e.g. a span policy passed in its position
            raise ValueError(f"async_scheduling must be True or False, got {self.async_scheduling!r}")
        ahead = self.span_ahead_tokens
        if ahead is not None and (not isinstance(ahead, int) or isinstance(ahead, bool) or ahead < 0):
            raise ValueError(f"span_ahead_tokens must be None or an integer >= 0, got {ahead!r}")


@dataclass(frozen=True)
class ControlTokens:
    """Span markers (MiniPIC): token ids of the model's own vocabulary, fed to the model like any token."""

    ssep_id: int | None = None
    pdep_id: int | None = None
    pad_id: int | None = None


@dataclass(frozen=True)
class EngineConfig:
    model_dir: Path
    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    control: ControlTokens = field(default_factory=ControlTokens)
    device: str = "cpu"
    dtype: str = "float32"
    enforce_eager: bool = False
    load_format: str = "auto"  # "auto": safetensors from model_dir; "dummy": random weights (benchmarks)

    def __post_init__(self):
        if self.dtype not in DTYPES:
            names = f"{', '.join(DTYPES)} (or their torch dtypes; auto: the device's)"
            raise ValueError(f"dtype must be one of {names}, got {self.dtype!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        self._check_control()

    def _check_control(self) -> None:
        """The span markers are token ids of this model's vocabulary (or None: that marker is off)."""
        if not isinstance(self.control, ControlTokens):
            raise TypeError(f"control_tokens must be a ControlTokens, got {type(self.control).__name__}")
        vocab_size = self.model.vocab_size
        for f in fields(ControlTokens):
            token_id = getattr(self.control, f.name)
            if token_id is not None and not (_is_int(token_id) and 0 <= token_id < vocab_size):
                raise ValueError(f"control_tokens.{f.name} must be a token id in [0, {vocab_size}), got {token_id!r}")

    @property
    def hash_namespace(self) -> str:
        """Block hashes of different models, dtypes, block sizes and cache modes never alias."""
        c = self.cache
        mode = f"pf{int(c.position_free)}" + ("rr" if c.rerotate_spans else "")
        return f"minipic:{self.model_dir.name}:{self.dtype}:B{c.block_size}:{mode}"

    @classmethod
    def from_options(
        cls,
        model_dir: Path,
        model: ModelConfig,
        device: str,
        control: ControlTokens,
        dtype: str | None = None,
        **options,
    ) -> EngineConfig:
        """The one place where `LLM(...)` keywords become a config: each keyword is a field of CacheConfig,
        SchedulerConfig or ENGINE_OPTIONS, defaulted there; None means the device's (dtype, num_scheduler_steps,
        async_scheduling)
        or the model's (max_model_len) default."""
        is_cuda = device.startswith("cuda")
        if options.get("max_model_len") is None:
            options["max_model_len"] = model.max_position
        if options.get("num_scheduler_steps") is None:
            options["num_scheduler_steps"] = DEFAULT_CUDA_SCHEDULER_STEPS if is_cuda else 1
        if options.get("async_scheduling") is None:
            options["async_scheduling"] = is_cuda
        cache = CacheConfig(**_pop_fields(options, CacheConfig))
        scheduler = SchedulerConfig(**_pop_fields(options, SchedulerConfig))
        engine = {k: options.pop(k) for k in ENGINE_OPTIONS & options.keys()}
        if options:
            raise TypeError(
                f"unknown option {', '.join(map(_named_like, options))}: the options are named in config.py"
            )
        if scheduler.max_model_len > model.max_position:
            raise ValueError(
                f"max_model_len={scheduler.max_model_len} is past the model's {model.max_position} positions "
                f"(max_position_embeddings in {Path(model_dir) / 'config.json'})"
            )
        dtype = dtype_name(dtype) or ("bfloat16" if is_cuda else "float32")
        if dtype == "float16" and not is_cuda:
            logger.warning("float16 on the CPU has no fast kernels: many times slower than float32 or bfloat16")
        return cls(model_dir, model, cache, scheduler, control, device, dtype, **engine)


DTYPE_ALIASES = {"auto": None, "half": "float16", "float": "float32"}  # vLLM's spellings


def dtype_name(dtype) -> str | None:
    """`LLM(dtype=...)` as a name of DTYPES, or None for the device's default: a name, vLLM's "auto", "half" or
    "float", or a torch.dtype (checked against DTYPES by EngineConfig)."""
    if type(dtype).__name__ == "dtype" and type(dtype).__module__ == "torch":  # NOTE: torch is not imported here
        dtype = str(dtype).removeprefix("torch.")
    return DTYPE_ALIASES.get(dtype, dtype) if isinstance(dtype, str) else dtype


ENGINE_OPTIONS = {"enforce_eager", "load_format"}  # the EngineConfig fields that are LLM(...) keywords
LLM_KEYWORDS = {"model", "device", "dtype", "control_tokens"}  # LLM(...)'s own arguments


def _is_int(value) -> bool:
    """An integer count: an int that is not a bool (True would count as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _named_like(option: str) -> str:
    """`option` quoted, with the known option nearest to it (vLLM's gpu_memory_utilization is memory_utilization)."""
    known = {f.name for c in (CacheConfig, SchedulerConfig) for f in fields(c)} | ENGINE_OPTIONS | LLM_KEYWORDS
    near = difflib.get_close_matches(option, sorted(known), n=1)
    return f"{option!r} (did you mean {near[0]!r}?)" if near else repr(option)


def _pop_fields(options: dict, config_class) -> dict:
    """The options that are fields of `config_class`, taken out of `options`."""
    return {name: options.pop(name) for name in {f.name for f in fields(config_class)} & options.keys()}
