"""The GGUF conversion's cache: published whole or not at all, also when two first starts convert at once."""

import pytest

from minipic_lite.models import loader
from tests.conftest import write_gguf


def finished_conversion(path, marker: str):
    path.mkdir()
    (path / "model.safetensors").write_text(marker)
    return path


def test_publish_renames_the_finished_folder(tmp_path):
    tmp, out = finished_conversion(tmp_path / "m.tmp-1", "mine"), tmp_path / "m"
    loader.publish(tmp, out)
    assert (out / "model.safetensors").read_text() == "mine" and not tmp.exists()


def test_a_copy_another_process_published_first_stands(tmp_path):
    """Two first starts at once: the second to finish keeps the first's cache (its own folder is dropped by
    convert_gguf), where it failed on the rename before (errno 39) and left its 517 MB behind."""
    out = finished_conversion(tmp_path / "m", "theirs")
    loader.publish(finished_conversion(tmp_path / "m.tmp-2", "mine"), out)
    assert (out / "model.safetensors").read_text() == "theirs"


def test_a_half_folder_in_the_way_is_not_taken_for_a_cache(tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "config.json").write_text("{}")  # no weights: not a published cache
    with pytest.raises(OSError):
        loader.publish(finished_conversion(tmp_path / "m.tmp-3", "mine"), out)


def test_a_failed_conversion_leaves_nothing_in_the_cache(tmp_path, monkeypatch):
    import transformers

    def fail(*args, **kwargs):
        raise RuntimeError("conversion failed")

    monkeypatch.setenv(loader.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fail)
    path = write_gguf(tmp_path / "tiny.gguf", "llama")
    with pytest.raises(RuntimeError, match="conversion failed"):
        loader.convert_gguf(path)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["by-file"]  # the file's digest (16 bytes), no model


def test_each_conversion_writes_into_a_folder_of_its_own(tmp_path, monkeypatch):
    """The folders two processes would write into differ (a fixed `.tmp` was shared before)."""
    import transformers

    folders = []

    def record(directory, *args, **kwargs):
        folders.append(directory)
        raise RuntimeError("stop here")

    class Tokenizer:
        def save_pretrained(self, directory):
            record(directory)

    class Model:
        config = type("Config", (), {"tie_word_embeddings": False, "to_dict": lambda self: {}})()

        def state_dict(self):
            return {}

    monkeypatch.setenv(loader.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Tokenizer())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: Model())
    path = write_gguf(tmp_path / "tiny.gguf", "llama")
    for _ in range(2):
        with pytest.raises(RuntimeError, match="stop here"):
            loader.convert_gguf(path)
    assert len(set(folders)) == 2 and all(
        f.name.startswith(loader._cache_dir_for(path).name + ".tmp-") for f in folders
    )
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["by-file"]  # the file's digest (16 bytes), no model
