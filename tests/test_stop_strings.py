"""Stop strings where a token boundary does not help: inside a token, across a burst boundary, in a stream.

Expected outputs come from the same greedy run without stop strings, cut by the definition (vLLM's): the
request stops at the first token after which the text contains the stop string; `token_ids` keep that token,
`text` ends just before the stop string.
"""

from itertools import pairwise

import pytest

import minipic_lite as mp
from minipic_lite.engine import shown_text

PROMPT = "The capital of France is"
MAX_TOKENS = 12
BURST = 4  # decode steps per burst: the prefill gives token 1, bursts give tokens 2-5, 6-9, ...


def greedy(**kwargs) -> mp.SamplingParams:
    return mp.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, **kwargs)


def cut_at(tokenizer, token_ids: list[int], stop: str) -> tuple[list[int], str]:
    """(token ids, text) a request that stops at `stop` returns: up to the first token whose text has it."""
    for num_tokens in range(1, len(token_ids) + 1):
        text = tokenizer.decode(token_ids[:num_tokens], skip_special_tokens=True)
        if stop in text:
            return token_ids[:num_tokens], text[: text.index(stop)]
    raise AssertionError(f"{stop!r} never appears in the output")


@pytest.fixture(scope="module")
def burst_llm(model_dir):
    return mp.LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=256, num_scheduler_steps=BURST)


@pytest.fixture(scope="module")
def base(llm):
    """The greedy output with no stop string (the same on both engines: test_bursts checks that)."""
    return llm.generate(PROMPT, greedy(ignore_eos=True), use_tqdm=False)[0]


def across_the_burst_boundary(tokenizer, token_ids: list[int]) -> str:
    """A stop string that starts in token 5 (the last of the first burst) and ends inside token 6."""
    text5 = tokenizer.decode(token_ids[:5], skip_special_tokens=True)
    text6 = tokenizer.decode(token_ids[:6], skip_special_tokens=True)
    assert text6.startswith(text5) and len(text6) - len(text5) >= 2, "token 6 must decode to 2+ characters"
    for head in (1, 2, 3):
        stop = text6[len(text5) - head : len(text5) + 1]  # ends one character into token 6
        if stop not in text5 and stop.strip():
            return stop
    raise AssertionError(f"no stop string across tokens 5 and 6 of {text6!r}")


def test_a_stop_string_that_ends_inside_a_token_stops_there(llm, base):
    stop = "Par"
    assert " Paris" in llm.tokenizer.decode(base.token_ids[:1])  # one token holds " Paris": "Par" ends inside it
    out = llm.generate(PROMPT, greedy(ignore_eos=True, stop=[stop]), use_tqdm=False)[0]
    token_ids, text = cut_at(llm.tokenizer, base.token_ids, stop)
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.token_ids == token_ids == base.token_ids[:1] and out.text == text == " "


@pytest.mark.parametrize("engine", ["one_step", "bursts"])
def test_a_stop_string_across_a_burst_boundary_stops_inside_the_next_burst(engine, llm, burst_llm, base):
    target = burst_llm if engine == "bursts" else llm
    stop = across_the_burst_boundary(llm.tokenizer, base.token_ids)
    seen, schedule = [], target.engine.scheduler.schedule
    target.engine.scheduler.schedule = lambda: seen.append(schedule()) or seen[-1]
    try:
        out = target.generate(PROMPT, greedy(ignore_eos=True, stop=[stop]), use_tqdm=False)[0]
    finally:
        del target.engine.scheduler.schedule
    token_ids, text = cut_at(llm.tokenizer, base.token_ids, stop)
    assert len(token_ids) == 6  # the stop string completes in token 6, the first of the second burst
    assert (out.finish_reason, out.stop_reason, out.token_ids, out.text) == ("stop", stop, token_ids, text)
    if engine == "bursts":
        assert [s.num_steps for s in seen] == [1, BURST, BURST]  # prefill, tokens 2-5, tokens 6-9 (cut at 6)
    pool = target.engine.pool
    pool.check_integrity()
    assert pool.num_free_blocks == pool.num_blocks


@pytest.mark.parametrize("engine", ["one_step", "bursts"])
@pytest.mark.parametrize("where", ["inside_a_token", "across_bursts"])
def test_a_streamed_output_never_shows_its_stop_string(engine, where, llm, burst_llm, base):
    target = burst_llm if engine == "bursts" else llm
    stop = "Par" if where == "inside_a_token" else across_the_burst_boundary(llm.tokenizer, base.token_ids)
    chunks = list(target.stream(PROMPT, greedy(ignore_eos=True, stop=[stop])))
    token_ids, text = cut_at(llm.tokenizer, base.token_ids, stop)
    last = chunks[-1]
    assert last.finished and (last.finish_reason, last.stop_reason) == ("stop", stop)
    assert (last.token_ids, last.text) == (token_ids, text)
    assert not any(stop in chunk.text for chunk in chunks)
    assert all(not chunk.finished for chunk in chunks[:-1])
    # NOTE: nothing shown is taken back: the part of the stop string that came a token early was held back
    assert all(later.text.startswith(chunk.text) for chunk, later in pairwise(chunks))


@pytest.mark.parametrize(
    ("text", "stop", "shown"),
    [
        ("Paris is", [], "Paris is"),
        ("Paris is", ["Lyon"], "Paris"),  # the last 3 characters may begin "Lyon"
        ("Paris is", ["x", "Lyon"], "Paris"),  # the longest stop string decides
        ("Paris is", ["x"], "Paris is"),  # a 1-character stop string is seen whole or not at all
        ("ab", ["abcdef"], ""),
        ("abcd", ["abcdef"], ""),  # shorter than the stop string: all of it may begin one
        ("Paris", ["Paris is"], ""),
        ("caf\ufffd", [], "caf"),  # an incomplete character's bytes: the next token may complete them
        ("caf\ufffd\ufffd", ["é!"], "caf"),
        ("\ufffd\ufffd end\ufffd", [], "\ufffd\ufffd end"),  # no-UTF-8 bytes at the start stay; only the end's go
    ],
)
def test_an_unfinished_output_shows_only_what_its_final_text_keeps(text, stop, shown):
    assert shown_text(text, stop) == shown


def test_the_tokenizer_decodes_a_character_cut_between_tokens_as_the_replacement_character(llm):
    """What shown_text counts on: a character whose bytes span two tokens decodes to '\ufffd' before its last."""
    decode = llm.tokenizer.decode
    ids = llm.tokenizer.encode("你好", add_special_tokens=False)
    partial = next(decode(ids[:n]) for n in range(1, len(ids)) if decode(ids[:n]).endswith("\ufffd"))
    assert not decode(ids).startswith(partial)  # shown as it is, a stream would take it back
    assert decode(ids).startswith(shown_text(partial, [])) and shown_text(partial, []) != partial


def test_the_command_line_streams_the_text_it_prints(llm, base, monkeypatch, capsys):
    """`minipic-lite generate --stream --stop S` printed, a token early, the start of S that the final text leaves
    out (before stop 63: each new piece was printed as it came, and none was taken back)."""
    import minipic_lite
    from minipic_lite import cli

    monkeypatch.setattr(minipic_lite, "LLM", lambda model, device, dtype: llm)
    stop = across_the_burst_boundary(llm.tokenizer, base.token_ids)
    args = ["generate", "--raw", PROMPT, "--stop", stop, "--ignore-eos", "--max-tokens", str(MAX_TOKENS)]
    replies = []
    for flags in ([], ["--stream"]):
        assert cli.main([*args, *flags]) == 0
        replies.append(capsys.readouterr().out)
    assert replies[0] == replies[1] == cut_at(llm.tokenizer, base.token_ids, stop)[1] + "\n"
