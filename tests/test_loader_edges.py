"""Edges of the model loader (models/loader.py) that test_loader and the CLI / API checks leave open, with stand-ins for
transformers (no model): a finished conversion is published whole (config.json without the quantization, no separate
LM head where the embeddings are tied, the tokenizer, a folder others may read), a first conversion creates the cache
path whole, a cached conversion is taken without converting again, the cache key follows the file's bytes (read once
per place and mtime), '~' is expanded while an error names the path as given, a plain module is no model package, a
folder with only a sentencepiece model has a tokenizer, the progress bar ends at 4 of 4 stages, an empty model path
is named as empty, a file gguf cannot read (or one that names no architecture) is named, a plain tokenizer is built
without AutoTokenizer and equals its, and a CPU start imports no torch._dynamo."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from minipic_lite.models import loader
from tests.conftest import save_tiny_llama, write_gguf


class Tokenizer:
    def save_pretrained(self, directory):
        (directory / "tokenizer.json").write_text("{}")


class TiedConfig:
    tie_word_embeddings = True

    def to_dict(self):
        return {"model_type": "llama", "quantization_config": {"q": 4}}


class TiedModel:
    config = TiedConfig()

    def state_dict(self):
        return {"embed.weight": torch.ones(2, 2), "lm_head.weight": torch.ones(2, 2)}


@pytest.fixture
def converting(tmp_path, monkeypatch):
    """A GGUF file whose conversion runs on the stand-ins; returns its path."""
    import transformers

    monkeypatch.setenv(loader.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Tokenizer())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: TiedModel())
    return write_gguf(tmp_path / "tiny.gguf", "llama")


def test_a_conversion_is_published_whole(converting, tmp_path):
    out = loader.convert_gguf(converting)
    assert out == loader._cache_dir_for(converting)
    assert set((tmp_path / "cache").iterdir()) == {out, out.parent / "by-file"}  # the model, its file's digest
    assert list(load_file(out / "model.safetensors")) == ["embed.weight"]  # tied: no LM head of its own
    assert json.loads((out / "config.json").read_text()) == {"model_type": "llama"}
    assert (out / "tokenizer.json").is_file() and (out.stat().st_mode & 0o777) == 0o755
    assert {f.name: f.stat().st_mode & 0o777 for f in out.iterdir()} == dict.fromkeys(
        ["model.safetensors", "config.json", "tokenizer.json"], 0o644
    )  # NOTE: safetensors wrote its file 0600 (stop 63's review found it): others could not read the weights


def test_a_first_conversion_makes_the_cache_folder_and_its_parents(converting, tmp_path, monkeypatch):
    """A first start on a machine with no cache yet (not even ~/.cache) creates the whole cache path."""
    root = tmp_path / "home" / ".cache" / "minipic_lite"
    monkeypatch.setenv(loader.CACHE_ENV, str(root))
    out = loader.convert_gguf(converting)
    assert out.parent == root and (out / "model.safetensors").is_file()


def test_a_cached_conversion_is_taken_without_converting_again(converting, monkeypatch):
    out = loader.convert_gguf(converting)
    monkeypatch.setattr(loader, "conversion_progress", None)  # a second conversion would fail at once
    assert loader.convert_gguf(converting) == out


def test_the_cache_key_follows_the_files_bytes_not_its_place_or_mtime(tmp_path, monkeypatch):
    """The same model in another venv, or installed again, finds its conversion (each converted again before stop 63:
    the key held the path and mtime); other bytes, at the same path and size, get a folder of their own."""
    monkeypatch.setenv(loader.CACHE_ENV, str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "m.gguf", "llama")
    before = loader._cache_dir_for(path)
    (tmp_path / "venv2").mkdir()
    copy = shutil.copy2(path, tmp_path / "venv2" / "m.gguf")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # reinstalled
    assert loader._cache_dir_for(path) == loader._cache_dir_for(Path(copy)) == before
    assert before.name.startswith("m-") and before.parent == tmp_path / "cache"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # one bit of the last tensor's bytes
    path.write_bytes(bytes(data))
    assert loader._cache_dir_for(path) != before


def test_a_files_digest_is_read_once_per_place_and_mtime(tmp_path, monkeypatch):
    monkeypatch.setenv(loader.CACHE_ENV, str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "m.gguf", "llama")
    digests = []
    monkeypatch.setattr(loader, "_file_digest", lambda p, digest=loader._file_digest: digests.append(p) or digest(p))
    first = loader._cache_dir_for(path)
    assert loader._cache_dir_for(path) == first and digests == [path]  # the second start read no bytes
    (memo,) = (tmp_path / "cache" / "by-file").iterdir()
    memo.write_text("garbage")  # a damaged memo is read again from the file
    assert loader._cache_dir_for(path) == first and digests == [path, path]
    blocked = tmp_path / "a file"
    blocked.write_text("")
    monkeypatch.setenv(loader.CACHE_ENV, str(blocked / "cache"))  # a cache folder it cannot make: the key still comes
    assert loader._cache_dir_for(path) == blocked / "cache" / first.name and len(digests) == 3


def test_a_home_relative_path_is_expanded_and_an_error_names_it_as_given(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert loader.model_source("~/model") == tmp_path / "model"
    with pytest.raises(ValueError, match=r"unknown model '~/nope' \(no such file or directory\)"):
        loader.model_source("~/nope")


def test_a_plain_module_is_no_model_package(monkeypatch):
    monkeypatch.setattr(loader, "DEFAULT_GGUF_PACKAGE", "difflib")  # a module, not a package: no folder
    with pytest.raises(FileNotFoundError, match="the default model needs the package 'difflib'"):
        loader.default_gguf_path()


def test_a_sentencepiece_model_is_a_tokenizer(tmp_path, monkeypatch):
    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda directory: ("tokenizer", directory))
    assert loader.load_tokenizer(tmp_path) is None
    (tmp_path / "tokenizer.model").write_bytes(b"")
    assert loader.load_tokenizer(tmp_path) == ("tokenizer", tmp_path)


def test_each_stage_shows_the_stages_done_before_it(capsys, tmp_path):
    with loader.conversion_progress(tmp_path / "model.gguf", tmp_path / "cache") as next_stage:
        next_stage()
        next_stage()
    err = capsys.readouterr().err
    assert re.search(r"0/4 stages [^\r\n]*reading the tokenizer", err)
    assert re.search(r"1/4 stages [^\r\n]*dequantizing the weights", err)
    assert re.findall(r"(\d+)/4 stages", err)[-1] == "4"  # a conversion that ends fills the bar: 4 of 4, not more


@pytest.mark.parametrize("model", ["", "  "], ids=["empty", "blank"])
def test_an_empty_model_path_is_named_as_empty_not_as_the_current_directory(model, tmp_path, monkeypatch):
    """Path("") is ".": `--model ''` (an unset shell variable) said "model directory '.' has no config.json", and in a
    model directory it loaded that directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"model is an empty path \(None: the embedded SmolLM2-135M-Instruct\)"):
        loader.model_source(model)


@pytest.mark.parametrize("num_bytes", [0, 8, 35], ids=["junk", "header-only", "cut-in-its-metadata"])
def test_a_file_that_is_no_gguf_names_itself(num_bytes, tmp_path, monkeypatch):
    """gguf's own errors named no file: "GGUF magic invalid", numpy's unpacking, an IndexError (a traceback from the
    command line, which reports ValueError in one line)."""
    monkeypatch.setenv(loader.CACHE_ENV, str(tmp_path / "cache"))
    whole = write_gguf(tmp_path / "whole.gguf", "llama").read_bytes()
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"junk" if num_bytes == 0 else whole[:num_bytes])
    with pytest.raises(ValueError, match=rf"cannot read {re.escape(repr(str(path)))} as a GGUF file: "):
        loader.resolve_model_dir(str(path))


def test_a_gguf_without_an_architecture_names_itself(tmp_path, monkeypatch):
    from gguf import GGUFWriter

    monkeypatch.setenv(loader.CACHE_ENV, str(tmp_path / "cache"))
    path = tmp_path / "bare.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.kv_data[0].pop("general.architecture")
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.close):
        step()
    with pytest.raises(ValueError, match=r"names no architecture \(general.architecture\)"):
        loader.resolve_model_dir(str(path))


def test_a_plain_tokenizer_is_built_directly_and_equals_what_autotokenizer_builds(model_dir):
    """SmolLM2's converted tokenizer is transformers' plain backend: load_tokenizer builds it without AutoTokenizer
    (whose config import took 1.1 s of a start on 2 cores), and it must be the same tokenizer."""
    from transformers import AutoTokenizer

    assert loader._tokenizer_class(model_dir) in loader.PLAIN_TOKENIZERS
    ours, auto = loader.load_tokenizer(model_dir), AutoTokenizer.from_pretrained(model_dir)
    assert type(ours) is type(auto)
    texts = ["Hello world", "  spaces\n\nand\ttabs", "你好 émoji 🎉", "<|im_start|>user\nhi<|im_end|>", "<repo_name>x"]
    for text in texts:
        for special in (True, False):
            assert ours.encode(text, add_special_tokens=special) == auto.encode(text, add_special_tokens=special)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == auto.apply_chat_template(
        chat, add_generation_prompt=True, tokenize=False
    )
    assert (ours.all_special_ids, ours.eos_token_id, ours.get_vocab()) == (
        auto.all_special_ids,
        auto.eos_token_id,
        auto.get_vocab(),
    )


@pytest.mark.parametrize(
    ("config", "built_by"),
    [
        ({"tokenizer_class": "TokenizersBackend"}, "PreTrainedTokenizerFast"),
        ({"tokenizer_class": "PreTrainedTokenizerFast"}, "PreTrainedTokenizerFast"),
        ({"tokenizer_class": "Qwen2Tokenizer"}, "AutoTokenizer"),  # a class of its own: AutoTokenizer finds it
        ({}, "AutoTokenizer"),
        (None, "AutoTokenizer"),  # no tokenizer_config.json
        ("not json", "AutoTokenizer"),
    ],
)
def test_only_a_plain_tokenizer_skips_autotokenizer(tmp_path, monkeypatch, config, built_by):
    import transformers

    for name in ("AutoTokenizer", "PreTrainedTokenizerFast"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", lambda directory, name=name: name)
    (tmp_path / "tokenizer.json").write_text("{}")
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    assert loader.load_tokenizer(tmp_path) == built_by


def test_a_cpu_start_imports_no_dynamo(tmp_path):
    """Nothing of a CPU engine compiles, yet building the model on the meta device imported torch._dynamo (0.9 s of a
    start on 2 cores: nn.Embedding's random draw and the RoPE table's ops on meta tensors); a fresh interpreter says."""
    model = save_tiny_llama(tmp_path / "tiny")
    code = (
        "import sys, minipic_lite as mp\n"
        f"llm = mp.LLM({str(model)!r}, device='cpu', dtype='float32', max_model_len=64)\n"
        "llm.generate([[1, 2, 3]], mp.SamplingParams(max_tokens=2), use_tqdm=False)\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]"
