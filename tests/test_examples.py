"""The examples run as written, and do what they print: checked on the objects each script leaves behind."""

import runpy
from pathlib import Path

from tests import span_oracle

EXAMPLES = Path(__file__).parent.parent / "examples"


def run_example(name: str, capsys) -> tuple[dict, str]:
    namespace = runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name="__main__")
    return namespace, capsys.readouterr().out


def test_every_example_is_tested():
    assert sorted(p.stem for p in EXAMPLES.glob("*.py")) == ["quickstart", "span_reuse"]


def test_quickstart(capsys):
    ns, stdout = run_example("quickstart", capsys)
    first, again, partial, llm = ns["first"], ns["again"], ns["partial"], ns["llm"]
    block_size = llm.config.cache.block_size
    num_full_blocks = (len(again.prompt_token_ids) - 1) // block_size  # the last token's block is computed
    assert num_full_blocks > 0 and again.num_cached_tokens == num_full_blocks * block_size
    assert again.token_ids == first.token_ids and len(first.token_ids) == 24
    assert first.text and first.text in stdout
    assert partial.finished and len(partial.token_ids) == 12
    assert f"cached prompt tokens {again.num_cached_tokens} of {len(again.prompt_token_ids)}" in stdout


def test_span_reuse(capsys):
    ns, stdout = run_example("span_reuse", capsys)
    composer, docs, prompt, out = ns["composer"], ns["docs"], ns["prompt"], ns["out"]
    control = composer.control
    warm = [list(p.token_ids) for p in composer.span_prompts("block_attention", docs)]
    expected = span_oracle.predicted_hits(
        list(prompt.token_ids), warm, composer.block_size, control.ssep_id, control.pdep_id
    )
    doc_blocks = [b for b in out.cache_report if b.label.startswith("doc")]
    assert [b.is_hit for b in doc_blocks] == [expected[b.index] for b in doc_blocks]
    assert doc_blocks and all(b.is_hit for b in doc_blocks)  # each document, moved to another offset, is reused
    assert sum(len(w) for w in warm) == len(doc_blocks) * composer.block_size
    assert out.text and out.text in stdout
