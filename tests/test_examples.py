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
    composer, docs, results = ns["composer"], ns["docs"], ns["results"]
    control = composer.control
    # the example warmed both span recipes, then asked with each recipe in turn; the oracle predicts each
    # prompt block's hit from the tokens it sees and the prompts that ran before it
    earlier = [list(p.token_ids) for r in ("block_attention", "epic") for p in composer.span_prompts(r, docs)]
    for recipe in ("prefix", "block_attention", "epic"):
        prompt, out = results[recipe]
        expected = span_oracle.predicted_hits(
            list(prompt.token_ids), earlier, composer.block_size, control.ssep_id, control.pdep_id
        )
        assert [b.is_hit for b in out.cache_report] == expected, recipe
        assert out.text and out.text in stdout
        earlier.append(list(prompt.token_ids) + out.token_ids)
    doc_blocks = [b for b in results["block_attention"][1].cache_report if b.label.startswith("doc")]
    assert doc_blocks and all(b.is_hit for b in doc_blocks)  # each document, moved to another offset, is reused
    assert not any(b.is_hit for b in results["prefix"][1].cache_report)  # other order: prefix caching misses


def readme_python_blocks() -> list[str]:
    import re

    readme = (EXAMPLES.parent / "README.md").read_text()
    section = readme[readme.index("## Use it from Python") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_readmes_python_section_runs_as_written(capsys):
    """The two blocks of "Use it from Python": the first as a script, the asyncio one inside a coroutine (its
    top-level `await` is a notebook's or `python -m asyncio`'s)."""
    import asyncio
    import textwrap

    first, async_block = readme_python_blocks()
    namespace: dict = {}
    exec(compile(first, "README.md (Python)", "exec"), namespace)  # noqa: S102 (the README's own code)
    llm, outs = namespace["llm"], namespace["outs"]
    import minipic_lite as mp

    assert llm is mp.get_default_llm()  # one engine, not two
    assert len(outs) == 3 and all(o.finished for o in outs) and outs[0].metrics.ttft > 0
    assert len(namespace["out"].outputs) == 3  # the n = 3 line
    scored = namespace["scored"]
    assert len(scored.prompt_logprobs) == len(scored.prompt_token_ids) and scored.prompt_logprobs[0] is None
    assert capsys.readouterr().out  # the stream printed its partial texts
    body = "async def readme():\n" + textwrap.indent(async_block, "    ")
    exec(compile(body, "README.md (asyncio)", "exec"), namespace)  # noqa: S102
    asyncio.run(namespace["readme"]())
    assert not llm.engine.has_unfinished()
