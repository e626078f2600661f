"""Edges of the model loader (models/loader.py) that test_loader and the CLI / API checks leave open, with stand-ins
for transformers (no model): a finished conversion is published whole (config.json without the quantization, no
separate LM head where the embeddings are tied, the tokenizer, a folder others may read), a cached conversion is
taken without converting again, the cache key moves with the file's mtime, '~' is expanded while an error names the
path as given, a plain module is no model package, and a folder with only a sentencepiece model has a tokenizer."""

import json
import os
import re

import pytest
import torch
from safetensors.torch import load_file

from minipic_lite.models import loader
from tests.conftest import write_gguf


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
    assert out == loader._cache_dir_for(converting) and list((tmp_path / "cache").iterdir()) == [out]
    assert list(load_file(out / "model.safetensors")) == ["embed.weight"]  # tied: no LM head of its own
    assert json.loads((out / "config.json").read_text()) == {"model_type": "llama"}
    assert (out / "tokenizer.json").is_file() and (out.stat().st_mode & 0o777) == 0o755


def test_a_cached_conversion_is_taken_without_converting_again(converting, monkeypatch):
    out = loader.convert_gguf(converting)
    monkeypatch.setattr(loader, "conversion_progress", None)  # a second conversion would fail at once
    assert loader.convert_gguf(converting) == out


def test_the_cache_key_moves_with_the_files_mtime(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "llama")
    before = loader._cache_dir_for(path)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert loader._cache_dir_for(path) != before and loader._cache_dir_for(path).name.startswith("m-")


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
