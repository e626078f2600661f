"""The public API on the real SmolLM2: prompts of every kind, sampling, stopping, streaming, bad input."""

import re
import time

import numpy as np
import pytest
import torch

import minipic_lite as mp
from minipic_lite.sampler import apply_top_k_top_p
from tests.conftest import save_tiny_llama, write_gguf

GREEDY8 = mp.SamplingParams(max_tokens=8, temperature=0.0)


def assert_engine_idle(llm):
    assert not llm.engine.has_unfinished()
    llm.engine.pool.check_integrity()
    assert llm.engine.pool.num_free_blocks == llm.engine.pool.num_blocks


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop": ["x"], "detokenize": False}, "detokenize"),
    ],
)
def test_nonsense_sampling_params_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mp.SamplingParams(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": "0.5"}, "temperature must be a number, got str"),
        ({"top_p": None}, "top_p must be a number, got NoneType"),
        ({"temperature": True}, "temperature must be a number, got bool"),
        ({"seed": "1"}, "seed must be an int or None, got str"),
        ({"seed": True}, "seed must be an int or None, got bool"),  # NOTE: a bool is an int to Python
        ({"max_tokens": True}, "max_tokens must be an integer >= 1, got bool"),
        ({"max_tokens": 8.0}, "max_tokens must be an integer >= 1, got float"),
        ({"top_k": True}, "top_k must be an integer >= 0"),
    ],
)
def test_sampling_params_of_the_wrong_type_name_themselves(kwargs, message):
    with pytest.raises(TypeError, match=message):
        mp.SamplingParams(**kwargs)


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1], ids=["past-2**64", "below-int64"])
def test_a_seed_torch_cannot_take_is_refused_before_it_reaches_a_step(seed):
    """torch.Generator takes [-2**63, 2**64 - 1]; past it the step failed for every running request."""
    with pytest.raises(ValueError, match=r"seed must lie in \[-2\*\*63, 2\*\*64 - 1\]"):
        mp.SamplingParams(seed=seed)
    for edge in (2**64 - 1, -(2**63)):
        torch.Generator().manual_seed(mp.SamplingParams(seed=edge).seed)


def test_numpy_scalars_are_numbers_to_sampling_params():
    assert mp.SamplingParams(temperature=np.float32(0.5), top_p=np.float64(0.9)).temperature == 0.5
    params = mp.SamplingParams(
        max_tokens=np.int64(5), top_k=np.int32(3), seed=np.uint64(7), stop_token_ids=[np.int64(2)]
    )
    assert (params.max_tokens, params.top_k, params.seed, params.stop_token_ids) == (5, 3, 7, (2,))
    assert all(type(v) is int for v in (params.max_tokens, params.top_k, params.seed, *params.stop_token_ids))


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("", "prompt 1: the prompt is empty"),
        ([5, 49152], "prompt 1: token id 49152 is outside the vocabulary"),
        ([5, -1], "prompt 1: token id -1 is outside the vocabulary"),
        ([5, 2**70], f"prompt 1: token id {2**70} is outside the vocabulary"),  # NOTE: past int64, as packed
        ([5, 1.5], "prompt 1: token id 1.5 is not an integer"),
        ([5, "7"], "prompt 1: token id '7' is not an integer"),
        ([1] * 2048, "prompt 1: the prompt has 2048 tokens; the model's context is 2048"),
        # NOTE: bytes that are no UTF-8 read with surrogateescape (b"caf\xe9"); the tokenizer raised a TypeError
        # about "TextEncodeInput"
        ("caf\udce9", re.escape("prompt 1: the text holds '\\udce9' at character 3, which is no Unicode character")),
        (
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "caf\udce9"}],
            re.escape("prompt 1: message 1's content holds '\\udce9' at character 3, which is no Unicode character"),
        ),
    ],
)
def test_bad_prompt_names_itself_and_the_engine_keeps_serving(llm, prompt, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(["Hello", prompt], GREEDY8, use_tqdm=False)
    assert_engine_idle(llm)  # nothing of the batch was queued
    assert len(llm.generate("Hello", GREEDY8, use_tqdm=False)[0].token_ids) == 8


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ([5, 1.5, 7], "prompt 0: token id 1.5 is not an integer"),  # said "a prompt must be ..., got int" until stop 63
        ([5, "7"], "prompt 0: token id '7' is not an integer"),
        (["Hello", 5], "prompt 1: a prompt must be text, token ids, chat messages or a Prompt, got int"),
    ],
)
def test_a_list_that_starts_with_a_token_id_is_one_prompts_ids(llm, prompts, message):
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        llm.generate(prompts, GREEDY8, use_tqdm=False)
    assert_engine_idle(llm)


def test_integer_token_ids_of_any_kind_are_taken_as_their_values(llm):
    """numpy's and torch's integers in a prompt (`list(array)`) are its ids, as Python ints in the outputs."""
    ids = llm.tokenizer.encode("The capital of France is", add_special_tokens=False)
    plain, numpy_ids, torch_ids = llm.generate([ids, list(np.array(ids)), list(torch.tensor(ids))], GREEDY8,
                                               use_tqdm=False)  # fmt: skip
    assert numpy_ids.token_ids == torch_ids.token_ids == plain.token_ids
    assert numpy_ids.prompt_token_ids == ids and {type(t) for t in numpy_ids.prompt_token_ids} == {int}


def test_prompt_of_the_wrong_type_is_a_type_error(llm):
    with pytest.raises(TypeError, match="prompt 0"):
        llm.generate([3.5], GREEDY8, use_tqdm=False)


def test_a_chat_message_without_role_or_content_names_itself(llm):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user"}]
    with pytest.raises(ValueError, match=r"prompt 1: message 1 must have a \"role\" and a \"content\" string"):
        llm.generate(["Hello", messages], GREEDY8, use_tqdm=False)
    assert_engine_idle(llm)


@pytest.mark.parametrize(
    ("device", "message"),
    [(123, "got 123"), ("tpu", "got 'tpu'"), ("CUDA", "got 'CUDA'"), ("cuda:x", "got 'cuda:x'")],
)
def test_a_device_llm_cannot_take_is_named(device, message):
    with pytest.raises(ValueError, match=f"device must be 'cpu', 'cuda' or 'cuda:N' .*{message}"):
        mp.LLM(device=device)


def test_devices_llm_takes():
    from minipic_lite.llm import checked_device

    assert checked_device("cpu") == checked_device(torch.device("cpu")) == "cpu"
    assert checked_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")


def test_a_model_that_is_not_a_path_is_a_type_error():
    with pytest.raises(TypeError, match="model must be a path \\(a str or os.PathLike\\) or None, got int"):
        mp.LLM(42)


def test_a_config_json_of_another_family_or_broken_names_the_problem(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_embd": 768, "n_layer": 12}')
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2': this engine runs"):
        mp.LLM(str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "llama", "vocab_size": 64}')
    with pytest.raises(ValueError, match="config.json lacks 'hidden_size'"):
        mp.LLM(str(tmp_path))
    (tmp_path / "config.json").write_text("not json")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        mp.LLM(str(tmp_path))


def test_module_level_generate_takes_params_or_keywords_not_both():
    """Keywords beside a SamplingParams were dropped without a word (max_tokens=3 gave its 20 tokens)."""
    params = mp.SamplingParams(max_tokens=20, temperature=0.0)
    with pytest.raises(TypeError, match="not both \\(got max_tokens\\)"):
        mp.generate("Hello", params, max_tokens=3)
    with pytest.raises(TypeError, match="not both \\(got bogus\\)"):
        mp.generate("Hello", params, bogus=1)
    with pytest.raises(TypeError, match="bogus"):
        mp.generate("Hello", bogus=1)


def test_unknown_model_path_and_unsupported_gguf(tmp_path):
    with pytest.raises(ValueError, match="unknown model"):
        mp.LLM(str(tmp_path / "nope"))
    path = write_gguf(tmp_path / "mamba.gguf", "mamba")
    with pytest.raises(ValueError, match="holds a 'mamba' model"):
        mp.LLM(str(path))


def test_text_token_ids_and_chat_prompts_agree(llm):
    messages = [{"role": "user", "content": "Name a color."}]
    text = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    by_chat, by_text, by_ids = llm.generate([messages, text, ids], GREEDY8, use_tqdm=False)
    assert by_chat.token_ids == by_text.token_ids == by_ids.token_ids
    assert by_chat.prompt_token_ids == ids and by_chat.prompt == text


def test_finish_reasons_and_stops(llm):
    prompt = "1, 2, 3, 4, 5, 6,"
    base = llm.generate(prompt, mp.SamplingParams(max_tokens=12, temperature=0.0), use_tqdm=False)[0]
    assert base.finish_reason == "length" and len(base.token_ids) == 12
    assert base.text == llm.tokenizer.decode(base.token_ids, skip_special_tokens=True)
    stop_text = base.text.split(",")[2]  # e.g. " 9"
    by_string = llm.generate(prompt, mp.SamplingParams(max_tokens=12, temperature=0.0, stop=[stop_text]),
                             use_tqdm=False)[0]  # fmt: skip
    assert by_string.finish_reason == "stop" and by_string.stop_reason == stop_text
    assert by_string.text == base.text[: base.text.index(stop_text)]
    stop_id = base.token_ids[3]
    by_token = llm.generate(prompt, mp.SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop_id]),
                            use_tqdm=False)[0]  # fmt: skip
    assert by_token.finish_reason == "stop" and by_token.token_ids[-1] == stop_id
    assert by_token.token_ids == base.token_ids[: base.token_ids.index(stop_id) + 1]


def test_ttft_runs_from_arrival_to_the_first_token_and_stays(llm):
    params = mp.SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    before = time.perf_counter()
    stream = llm.stream("The quick brown fox", params)
    first = next(stream)  # the request is queued here, and its first token comes with this output
    first_seen = time.perf_counter()
    *_, last = stream
    done = time.perf_counter()
    m = last.metrics
    assert before <= m.arrival_time < m.first_token_time <= first_seen <= m.finish_time <= done
    assert first.metrics.first_token_time == m.first_token_time and first.metrics.finish_time is None
    assert (m.ttft, m.total_time) == (m.first_token_time - m.arrival_time, m.finish_time - m.arrival_time)
    assert m.ttft < m.total_time  # five more steps came after the first token


def test_the_ttft_holds_the_encoding_and_the_checks(llm, monkeypatch):
    """Every prompt of a generate() call arrives as the call starts, before any is encoded or checked (as vLLM's
    arrival comes before its input processing), so its TTFT holds them; `make_request` alone arrives as it starts,
    before its checks, unless it is given an arrival time."""
    encoded, checked = [], []
    real_encode, real_check = llm.encode, llm.engine._check

    def encode(prompt):
        encoded.append(time.perf_counter())
        return real_encode(prompt)

    def check(*args):
        checked.append(time.perf_counter())
        return real_check(*args)

    monkeypatch.setattr(llm, "encode", encode)
    monkeypatch.setattr(llm.engine, "_check", check)
    params = mp.SamplingParams(max_tokens=1, temperature=0.0)
    first, second = llm.generate(["The quick brown fox", "jumps over"], params, use_tqdm=False)
    assert len(encoded) == len(checked) == 2
    assert first.metrics.arrival_time == second.metrics.arrival_time < encoded[0] < checked[0]
    req = llm.engine.make_request([100, 101, 102], params)
    assert req.arrival_time < checked[-1]
    assert llm.engine.make_request([100, 101, 102], params, arrival_time=5.0).arrival_time == 5.0


def test_eos_stops_unless_ignored(llm):
    chat = [{"role": "user", "content": "Say hi."}]
    out = llm.generate(chat, mp.SamplingParams(max_tokens=64, temperature=0.0), use_tqdm=False)[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == 2  # <|im_end|>
    ignored = llm.generate(chat, mp.SamplingParams(max_tokens=len(out.token_ids) + 3, temperature=0.0,
                                                   ignore_eos=True), use_tqdm=False)[0]  # fmt: skip
    assert ignored.finish_reason == "length" and ignored.token_ids[: len(out.token_ids)] == out.token_ids


def test_seeded_sampling_is_reproducible_and_batch_independent(llm):
    params = [mp.SamplingParams(max_tokens=16, temperature=1.0, seed=s) for s in (1, 1, 2)]
    a, b, c = llm.generate(["Once upon a time"] * 3, params, use_tqdm=False)
    assert a.token_ids == b.token_ids != c.token_ids
    alone = llm.generate("Once upon a time", params[2], use_tqdm=False)[0]
    assert alone.token_ids == c.token_ids


def test_top_k_one_is_greedy(llm):
    greedy = llm.generate("The sky is", mp.SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)[0]
    top1 = llm.generate("The sky is", mp.SamplingParams(max_tokens=8, temperature=0.8, top_k=1, seed=3),
                        use_tqdm=False)[0]  # fmt: skip
    assert top1.token_ids == greedy.token_ids


def test_top_k_top_p_masks_exactly():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]]))
    masked = apply_top_k_top_p(logits, torch.tensor([0, 2]), torch.tensor([0.7, 1.0]))
    kept = torch.isfinite(masked)
    # row 0: top-p 0.7 keeps 0.5 and 0.3 (mass before 0.3 is 0.5 < 0.7; before 0.15 it is 0.8)
    # row 1: top-k 2 keeps 0.4 and 0.3
    assert kept.tolist() == [[True, True, False, False], [False, False, True, True]]
    assert torch.equal(masked[kept], logits[kept])


def test_stream_yields_growing_text_and_matches_generate(llm):
    params = mp.SamplingParams(max_tokens=10, temperature=0.0)
    chunks = list(llm.stream("The quick brown fox", params))
    assert len(chunks) == 10 and chunks[-1].finished and not chunks[0].finished
    assert all(b.text.startswith(a.text) for a, b in zip(chunks, chunks[1:], strict=False))
    assert chunks[-1].token_ids == llm.generate("The quick brown fox", params, use_tqdm=False)[0].token_ids


def test_closing_a_stream_early_frees_its_request(llm):
    stream = llm.stream("Tell me a long story.", mp.SamplingParams(max_tokens=50))
    next(stream)
    stream.close()
    assert_engine_idle(llm)


def test_module_level_generate_uses_the_embedded_model():
    out = mp.generate("The capital of France is", max_tokens=4)
    assert isinstance(out, mp.RequestOutput) and len(out.token_ids) == 4
    assert "Paris" in out.text
    batch = mp.generate(["a", "b"], max_tokens=2)
    assert [len(o.token_ids) for o in batch] == [2, 2] and [o.prompt for o in batch] == ["a", "b"]


class _Vocab:
    unk_token_id = 0

    def __init__(self, ids):
        self.ids = ids

    def convert_tokens_to_ids(self, token):
        return self.ids.get(token, self.unk_token_id)


def test_the_checkpoint_turn_start_is_the_tokenizers_im_start_where_it_has_one():
    from minipic_lite.llm import chat_turn_start_id

    assert chat_turn_start_id(_Vocab({"<|im_start|>": 1})) == 1  # SmolLM2's
    assert chat_turn_start_id(_Vocab({})) is None  # not in the vocabulary: unknown
    assert chat_turn_start_id(None) is None  # no tokenizer


def test_the_engine_hashes_a_span_prompt_from_its_packed_bytes_as_the_pure_functions_do(llm):
    from minipic_lite.spans import prompt_block_hashes, span_layout

    docs = ["The cat sat on the mat and looked at the door. " * 6, "Paris is the capital of France. " * 5]
    ids = list(llm.composer.block_attention("You answer briefly.", docs, "Where is Paris?").token_ids)
    control, block_size = llm.config.control, llm.config.cache.block_size
    req = llm.engine.make_request(ids, GREEDY8, require_spans=True)  # NOTE: hashed from validation's bytes
    assert req.layout == span_layout(ids, control, block_size) and req.layout.has_spans
    assert req.block_hashes == prompt_block_hashes(ids, control, block_size, llm.engine.root)
    assert req.prompt_bytes is None and len(req.block_hashes) == len(ids) // block_size


def test_a_model_without_a_tokenizer_takes_token_ids_and_says_so_for_text(tmp_path):
    """A saved model with no tokenizer (as the GPU benches' random models): text, chats and the text composer are
    clear errors; token ids generate, with empty text."""
    llm = mp.LLM(str(save_tiny_llama(tmp_path)), device="cpu", max_model_len=128, num_blocks=16)
    for prompt in ("Hello", [{"role": "user", "content": "Hello"}]):
        with pytest.raises(ValueError, match="has no tokenizer: pass prompts as token ids"):
            llm.generate(prompt, GREEDY8, use_tqdm=False)
    with pytest.raises(ValueError, match="has no tokenizer: compose pieces from token ids"):
        mp.PromptComposer.for_llm(llm)
    params = mp.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False)
    (out,) = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)
    assert len(out.token_ids) == 4 and out.text == ""
    llm.close()


def test_span_markers_are_smollm2s_tokens_where_the_tokenizer_has_them_and_none_elsewhere(llm):
    """The markers are tokens of the model's own vocabulary: SmolLM2's unused <repo_name> / <reponame> / <file_sep>.
    A tokenizer without them (its unknown token comes back) leaves the engine with no span markers."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from minipic_lite.config import ControlTokens
    from minipic_lite.llm import default_control_tokens

    ours = default_control_tokens(llm.tokenizer)
    ids = llm.tokenizer.convert_tokens_to_ids(["<repo_name>", "<reponame>", "<file_sep>"])
    assert (ours.ssep_id, ours.pdep_id, ours.pad_id) == tuple(ids) and len(set(ids)) == 3
    assert llm.config.control == ours
    vocab = {"[UNK]": 0, "hello": 1, "<repo_name>": 2}  # one marker of three: still none
    other = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")), unk_token="[UNK]"
    )
    assert default_control_tokens(other) == ControlTokens()


def test_a_markers_text_in_a_text_or_chat_prompt_is_refused_where_markers_take_effect(llm, model_dir):
    """Typed or retrieved text holding "<repo_name>" would open a span (at a block start) or fail with advice on
    padding; the composer alone places markers. On a vanilla (rotated-key) engine markers are ordinary tokens."""
    running_before = llm.stats()["num_running"] + llm.stats()["num_waiting"]
    prompts = {
        "text, mid-block": "What does <repo_name> mean in StarCoder data?",
        "text, at a block start": "<repo_name>minipic/lite is a repo",
        "chat": [{"role": "user", "content": "Explain <reponame> to me."}],
    }
    for name, prompt in prompts.items():
        marker, kind = ("<reponame>", "PDEP") if name == "chat" else ("<repo_name>", "SSEP")
        with pytest.raises(ValueError, match=f"prompt 1: the prompt's text holds '{marker}', this model's {kind} span"):
            llm.generate(["Hi.", prompt], GREEDY8, use_tqdm=False)
    assert llm.stats()["num_running"] + llm.stats()["num_waiting"] == running_before  # nothing was queued
    vanilla = mp.LLM(str(model_dir), device="cpu", max_model_len=256, position_free=False)
    try:
        (out,) = vanilla.generate(prompts["text, mid-block"], GREEDY8, use_tqdm=False)
        assert 3 in out.prompt_token_ids and len(out.token_ids) > 0
    finally:
        vanilla.close()


def test_a_markers_text_is_refused_in_the_rerotate_baseline_too(model_dir):
    """The copy-rerotate baseline (rotated keys, rerotate_spans) gives span markers their meaning as position-free
    mode does: a marker's text in a text prompt would open a span there too."""
    rerotate = mp.LLM(str(model_dir), device="cpu", max_model_len=256, position_free=False, rerotate_spans=True)
    try:
        with pytest.raises(ValueError, match="prompt 0: the prompt's text holds '<repo_name>', this model's SSEP span"):
            rerotate.generate("What does <repo_name> mean in StarCoder data?", GREEDY8, use_tqdm=False)
    finally:
        rerotate.close()


def test_prompts_of_a_type_generate_cannot_take_name_it(llm):
    with pytest.raises(TypeError, match="prompts must be text, token ids, chat messages, a Prompt or a list of these"):
        llm.generate(3.5, GREEDY8, use_tqdm=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for CUDA where torch sees none")
def test_asking_for_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="device='cuda' was asked for, but torch sees no CUDA device"):
        mp.LLM(device="cuda")


def test_a_stream_left_open_at_exit_ends_quietly(tmp_path):
    """A stream half read when the interpreter exits: its finalizer ran after the loop had closed and printed
    "Exception ignored in: <generator LLM._stream> ... TypeError" on stderr."""
    import subprocess
    import sys

    save_tiny_llama(tmp_path / "tiny")
    script = (
        "import minipic_lite as mp\n"
        f"llm = mp.LLM({str(tmp_path / 'tiny')!r}, device='cpu')\n"
        "stream = llm.stream([1, 2, 3], mp.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True))\n"
        "print(len(next(stream).token_ids))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_package_lists_its_public_names_before_importing_them():
    """`import minipic_lite` imports no torch (PEP 562 exports), yet dir() (tab completion, help()) lists every
    public name; an unknown one is an AttributeError naming it."""
    import subprocess
    import sys

    script = (
        "import sys, minipic_lite as mp\n"
        "print(sorted(set(mp.__all__) - set(dir(mp))), 'LLM' in vars(mp), 'torch' in sys.modules)\n"
        "mp.Nope\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout == "[] False False\n"
    assert done.stderr.endswith("AttributeError: module 'minipic_lite' has no attribute 'Nope'\n"), done.stderr
