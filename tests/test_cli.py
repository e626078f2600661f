"""The command line behaves like a Unix tool: user errors are one line with the right exit status, found
before anything loads; `--help` imports neither torch nor transformers; prompts come from an argument, a
file or standard input. Each case runs `python -m minipic_lite.cli` in a fresh interpreter."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import minipic_lite as mp
from tests.conftest import save_tiny_llama, write_gguf

ROOT = Path(__file__).resolve().parent.parent
PROBE_MARK = "heavy modules imported: "
# Runs the CLI's main() and then reports on stdout which heavy modules it pulled in (usage errors print
# nothing on stdout; --help prints before the mark).
PROBE = f"""
import sys
from minipic_lite.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "transformers", "triton") if m in sys.modules)
print({PROBE_MARK!r} + ",".join(heavy))
sys.exit(code)
"""
QUESTION = "What is the capital of France?"
MAX_TOKENS = 12


def run_cli(*args: str, stdin: str | bytes | None = None, probe: bool = False, timeout: float = 300, env=None):
    """(exit status, stdout, stderr) of one CLI run in a fresh interpreter, from the repository root; standard
    input as text, or as bytes (which need not be UTF-8)."""
    cmd = [sys.executable, "-c", PROBE, *args] if probe else [sys.executable, "-m", "minipic_lite.cli", *args]
    env = None if env is None else {**os.environ, **env}
    text = not isinstance(stdin, bytes)
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=text, cwd=ROOT, timeout=timeout, env=env)
    decode = (lambda out: out) if text else (lambda out: out.decode())
    return done.returncode, decode(done.stdout), decode(done.stderr)


def heavy_modules(stdout: str) -> str:
    (line,) = [x for x in stdout.splitlines() if x.startswith(PROBE_MARK)]
    return line.removeprefix(PROBE_MARK)


# -- help and version: instant, no torch ---------------------------------------------------------------------


@pytest.mark.parametrize("args", [["--help"], ["generate", "--help"], ["chat", "--help"], ["--version"]], ids=" ".join)
def test_help_and_version_import_no_torch(args):
    code, out, err = run_cli(*args, probe=True)
    assert code == 0, err
    assert heavy_modules(out) == ""


def test_generate_help_shows_every_option_with_its_default():
    code, out, _ = run_cli("generate", "--help")
    assert code == 0
    options = (
        "--file",
        "--stream",
        "--seed",
        "--top-p",
        "--top-k",
        "--min-p",
        "--repetition-penalty",
        "--presence-penalty",
        "--frequency-penalty",
        "--device",
        "--model",
        "--dtype",
        "--raw",
        "--stop",
        "-n N",
        "--min-tokens",
    )
    for option in (*options, "--ignore-eos"):
        assert option in out
    assert "default: 128" in out and "default: 0.0" in out  # max tokens, temperature


def test_python_dash_m_minipic_lite_is_the_command_line():
    """`python -m minipic_lite` (as `python -m vllm.entrypoints...` or `python -m ui`) runs the same CLI: without a
    console script on the PATH it was "'minipic_lite' is a package and cannot be directly executed"."""
    done = subprocess.run([sys.executable, "-m", "minipic_lite", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.split()[0] == "minipic-lite", done.stderr
    done = subprocess.run([sys.executable, "-m", "minipic_lite", "generate"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.startswith("minipic-lite generate: error: give a prompt")


def test_version_names_the_installed_package():
    from importlib.metadata import version

    code, out, _ = run_cli("--version")
    assert code == 0 and out.split() == ["minipic-lite", version("minipic-lite")]


# -- usage errors: one line, exit 2, before anything loads ---------------------------------------------------

USAGE_ERRORS = {
    "no-command": ([], "the following arguments are required: COMMAND"),
    "no-prompt": (["generate"], "give a prompt"),
    "prompt-and-file": (["generate", "hi", "--file", "x.txt"], "exactly one"),
    "empty-prompt": (["generate", ""], "the prompt is empty"),
    "blank-prompt": (["generate", "  \n"], "the prompt is empty"),
    "negative-max-tokens": (["generate", "hi", "--max-tokens", "-1"], "--max-tokens: must be an integer >= 1"),
    "zero-max-tokens": (["generate", "hi", "--max-tokens", "0"], "--max-tokens: must be an integer >= 1"),
    "negative-temperature": (["generate", "hi", "--temperature", "-1"], "--temperature: must be a number >= 0"),
    "nan-temperature": (["generate", "hi", "--temperature", "nan"], "--temperature: must be a number >= 0"),
    "top-p-zero": (["generate", "hi", "--top-p", "0"], "--top-p: must be a number in (0, 1]"),
    "top-k-negative": (["generate", "hi", "--top-k", "-5"], "--top-k: must be an integer >= -1"),
    "seed-not-int": (["generate", "hi", "--seed", "x"], "--seed: must be an integer"),
    "seed-past-64-bits": (
        ["generate", "hi", "--seed", str(2**64)],
        "--seed: must be an integer in [-2**63, 2**64 - 1]",
    ),
    "min-past-max": (["generate", "hi", "--min-tokens", "9", "--max-tokens", "8"], "--min-tokens 9 is more than"),
    "negative-min-tokens": (["chat", "--min-tokens", "-1"], "--min-tokens: must be an integer >= 0"),
    "chat-min-past-max": (["chat", "--min-tokens", "9", "--max-tokens", "8"], "--min-tokens 9 is more than"),
    # NOTE: fine values: the run gets as far as the model
    "min-equal-max": (
        ["generate", "hi", "--min-tokens", "8", "--max-tokens", "8", "--model", "no/such/dir"],
        "unknown model 'no/such/dir'",
    ),
    "min-zero": (["chat", "--min-tokens", "0", "--model", "no/such/dir"], "unknown model 'no/such/dir'"),
    "zero-replies": (["generate", "hi", "-n", "0"], "argument -n: must be an integer >= 1"),
    "stream-of-replies": (["generate", "hi", "-n", "2", "--stream"], "--stream prints one reply as it comes"),
    "bad-device": (["generate", "hi", "--device", "tpu"], "--device: must be auto, cpu, cuda or cuda:N"),
    "bad-dtype": (["generate", "hi", "--dtype", "int8"], "--dtype: invalid choice"),
    "missing-model": (["generate", "hi", "--model", "no/such/dir"], "unknown model 'no/such/dir'"),
    "empty-model": (["generate", "hi", "--model", ""], "model is an empty path"),
    "model-not-gguf": (["generate", "hi", "--model", "README.md"], "not a directory or a .gguf file"),
    "model-dir-without-config": (["generate", "hi", "--model", "tests"], "has no config.json"),
    "missing-file": (["generate", "--file", "no/such.txt"], "cannot read --file 'no/such.txt'"),
    "unknown-command": (["serve"], "invalid choice: 'serve'"),
    "unknown-option": (["generate", "hi", "--frobnicate"], "generate: error: unrecognized arguments: --frobnicate"),
    # NOTE: named by the command, whose --help lists its options (an HF user's --max-new-tokens lands here)
    "unknown-ui-option": (
        ["ui", "--share"],
        "minipic-lite ui: error: unrecognized arguments: --share (see minipic-lite ui",
    ),
}


@pytest.mark.parametrize("case", list(USAGE_ERRORS))
def test_usage_error_is_one_line_exit_2_before_loading(case):
    args, message = USAGE_ERRORS[case]
    code, out, err = run_cli(*args, probe=True)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("minipic-lite"), err
    assert message in err and "error:" in err and "--help" in err
    assert heavy_modules(out) == ""  # checked before torch, transformers or the model were touched


def test_file_that_is_not_utf8_is_a_usage_error(tmp_path):
    path = tmp_path / "prompt.bin"
    path.write_bytes(b"\xff\xfe\x00bad")
    code, _, err = run_cli("generate", "--file", str(path))
    assert code == 2 and err.count("\n") == 1 and "cannot read --file" in err


def test_empty_stdin_is_a_usage_error():
    code, out, err = run_cli("generate", "-", stdin="\n", probe=True)
    assert code == 2 and err.count("\n") == 1 and "the prompt is empty" in err
    assert heavy_modules(out) == ""


# -- errors of the run itself: one line, exit 1 --------------------------------------------------------------


def test_unsupported_gguf_is_one_line_exit_1(tmp_path):
    path = write_gguf(tmp_path / "mamba.gguf", "mamba")
    code, out, err = run_cli("generate", "hi", "--model", str(path))
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "holds a 'mamba' model" in err and "Traceback" not in err


@pytest.mark.parametrize("source", ["stdin-strict", "stdin-escaped", "argument"])
def test_a_prompt_of_bytes_that_are_not_utf8_is_a_usage_error_before_anything_loads(source):
    """'café' in Latin-1 (b"caf\\xe9"), on standard input read strictly (a UTF-8 locale) or with its bad byte escaped
    (the C locale), or as an argument (always escaped): one line naming the problem, exit 2 as a --file that is no
    UTF-8, and no model loaded (before: the tokenizer's TypeError about "TextEncodeInput", exit 1 after the load)."""
    latin1, args = b"caf\xe9 au lait\n", ("generate", "-")
    env = {"PYTHONIOENCODING": "utf-8:strict" if source == "stdin-strict" else "utf-8:surrogateescape"}
    if source == "argument":
        args = ("generate", latin1.decode(errors="surrogateescape"))  # NOTE: Python encodes it back to those bytes
    code, out, err = run_cli(*args, probe=True, stdin=latin1 if source != "argument" else b"", env=env)
    (line,) = err.splitlines()
    if source == "stdin-strict":
        assert line == (
            "minipic-lite generate: error: cannot read standard input: 'utf-8' codec can't decode byte 0xe9 in "
            "position 3: invalid continuation byte (see minipic-lite generate --help)"
        )
    else:
        assert line == (
            "minipic-lite generate: error: the prompt holds '\\udce9' at character 3, which is no Unicode character "
            "(bytes that are not UTF-8, read as text?) (see minipic-lite generate --help)"
        )
    assert code == 2 and heavy_modules(out) == ""


def test_prompt_longer_than_the_context_is_one_line_exit_1(tmp_path, model_dir):
    from minipic_lite.config import ModelConfig

    context = ModelConfig.from_dir(model_dir).max_position
    path = tmp_path / "long.txt"
    path.write_text("cache " * (context + 100))  # a prompt no command line could carry
    code, out, err = run_cli("generate", "--file", str(path), "--max-tokens", "1")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "the model's context is" in err and "prompt 0" not in err, err


# -- prompts from an argument, a file and standard input: the same reply as the Python API -------------------


@pytest.fixture(scope="module")
def expected_reply(llm):
    chat = [{"role": "user", "content": QUESTION}]
    return llm.generate(chat, mp.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0), use_tqdm=False)[0].text


def test_stdin_prompt_streams_the_reply(expected_reply):
    code, out, err = run_cli("generate", "-", "--stream", "--max-tokens", str(MAX_TOKENS), stdin=QUESTION + "\n")
    assert code == 0, err
    assert out == expected_reply + "\n"
    assert "generated" in err and "Traceback" not in err


def test_file_prompt_gives_the_api_reply(tmp_path, expected_reply):
    path = tmp_path / "question.txt"
    path.write_text(QUESTION + "\n")
    code, out, err = run_cli("generate", "--file", str(path), "--max-tokens", str(MAX_TOKENS))
    assert code == 0, err
    assert out == expected_reply + "\n"
    (summary,) = err.splitlines()  # no progress bars, no warnings: the one-line summary
    assert summary.startswith("[") and "generated" in summary and "ttft" in summary


def test_stop_and_ignore_eos_give_the_api_reply(llm):
    prompt, stop = "1, 2, 3, 4,", " 9"
    params = mp.SamplingParams(max_tokens=24, temperature=0.0, stop=[stop], ignore_eos=True)
    expected = llm.generate(prompt, params, use_tqdm=False)[0]
    assert expected.finish_reason == "stop"  # the stop string is met before the 24 tokens
    code, out, err = run_cli("generate", "--raw", prompt, "--max-tokens", "24", "--stop", stop, "--ignore-eos")
    assert code == 0, err
    assert out == expected.text + "\n" and "(stop)" in err


def test_min_tokens_gives_the_api_reply(llm):
    params = mp.SamplingParams(max_tokens=12, temperature=0.0, min_tokens=6)
    expected = llm.generate("Tell me a story.", params, use_tqdm=False)[0]
    assert len(expected.token_ids) > 6  # greedy, it ends at once without min_tokens
    code, out, err = run_cli("generate", "--raw", "Tell me a story.", "--min-tokens", "6", "--max-tokens", "12")
    assert code == 0, err
    assert out == expected.text + "\n" and f"{len(expected.token_ids)} generated" in err


def test_n_replies_are_the_apis_n_completions_each_under_its_header(llm):
    params = mp.SamplingParams(max_tokens=10, temperature=0.9, seed=3, n=3)
    expected = llm.generate([{"role": "user", "content": QUESTION}], params, use_tqdm=False)[0]
    code, out, err = run_cli(
        "generate", QUESTION, "-n", "3", "--temperature", "0.9", "--seed", "3", "--max-tokens", "10"
    )
    assert code == 0, err
    assert out == "".join(f"--- reply {c.index + 1} of 3 ---\n{c.text}\n" for c in expected.outputs)
    assert len({c.text for c in expected.outputs}) > 1, "three seeds gave one reply"
    total = sum(len(c.token_ids) for c in expected.outputs)
    reasons = ", ".join(c.finish_reason for c in expected.outputs)
    assert f"{total} generated in 3 replies ({reasons})" in err


def test_chat_answers_each_line_as_the_api_answers_the_conversation_and_reuses_its_prefix(llm, model_dir):
    """Each line a message, each reply the API's for the conversation so far (greedy); the second turn finds the
    first's prompt blocks cached; a message past the context is one error line and the conversation goes on; /reset
    starts anew."""
    import re

    from minipic_lite.config import ModelConfig

    params = mp.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    q1, q2, q3 = "What is the capital of France?", "And of Italy?", "Name a color."
    turn1 = [{"role": "user", "content": q1}]
    r1 = llm.generate(turn1, params, use_tqdm=False)[0].text
    turn2 = [*turn1, {"role": "assistant", "content": r1}, {"role": "user", "content": q2}]
    r2 = llm.generate(turn2, params, use_tqdm=False)[0].text
    r3 = llm.generate([{"role": "user", "content": q3}], params, use_tqdm=False)[0].text
    too_long = "cache " * (ModelConfig.from_dir(model_dir).max_position + 100)
    not_utf8 = "caf\udce9"  # NOTE: 'café' in Latin-1, as bytes: b"caf\xe9"
    stdin = f"{q1}\n{q2}\n\n{too_long}\n{not_utf8}\n/reset\n{q3}\n".encode(errors="surrogateescape")
    strict = {"PYTHONIOENCODING": "utf-8:strict"}  # NOTE: a UTF-8 locale's reading (the C locale escapes such bytes)
    code, out, err = run_cli("chat", "--max-tokens", str(MAX_TOKENS), stdin=stdin, env=strict)
    assert code == 0, err
    assert out == f"{r1}\n{r2}\n{r3}\n"
    assert "minipic-lite chat: error: the message holds '\\udce9' at character 3, which is no Unicode" in err, err
    cached = [int(n) for n in re.findall(r"prompt tokens, (\d+) of them cached", err)]
    assert len(cached) == 3 and cached[0] == 0 and cached[1] >= 32, err  # the first turn's 37-token prompt: 2 blocks
    assert "minipic-lite chat: error: " in err and "the model's context is" in err and "[a new conversation]" in err
    assert "(/reset starts a new conversation)" in err


def test_ctrl_c_in_a_chat_reply_stops_that_reply_and_the_chat_goes_on(llm):
    """On a terminal (a pseudo-terminal here: stdin and stderr; stdout piped): Ctrl-C while a reply streams stops it,
    says so, and keeps it out of the conversation; the next message is answered as the API answers it alone; Ctrl-D
    ends with status 0."""
    import fcntl
    import os
    import pty
    import re
    import select
    import signal
    import struct
    import termios
    import time

    question = "What is the capital of France?"
    expected = llm.generate([{"role": "user", "content": question}], mp.SamplingParams(max_tokens=300, temperature=0.0,
                            ignore_eos=True, stop=["Paris"]), use_tqdm=False)[0]  # fmt: skip
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    command = [sys.executable, "-m", "minipic_lite.cli", "chat", "--max-tokens", "300", "--ignore-eos", "--stop"]
    command.append("Paris")
    # NOTE: SIGINT at its default in the child: a shell's background job (the suite started with `&`) ignores it, and
    # Python then installs no KeyboardInterrupt handler
    default_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    chat = subprocess.Popen(
        command, stdin=slave, stdout=subprocess.PIPE, stderr=slave, cwd=ROOT, preexec_fn=default_sigint
    )
    os.close(slave)
    seen = {master: b"", chat.stdout.fileno(): b""}

    def read_until(fd, pattern: bytes = b"", size: int = 0, seconds: float = 120) -> None:
        """Read both until `fd` holds `pattern` and at least `size` bytes."""
        deadline, done = time.monotonic() + seconds, lambda: pattern in seen[fd] and len(seen[fd]) >= size
        while not done() and time.monotonic() < deadline:
            for ready in select.select(list(seen), [], [], 0.1)[0]:
                seen[ready] += os.read(ready, 4096)
        assert done(), seen

    try:
        read_until(master, b"> ")
        os.write(master, b"Count from 1 to 500, one number a line.\n")
        read_until(chat.stdout.fileno(), size=40)  # the reply is streaming (300 tokens take seconds)
        chat.send_signal(signal.SIGINT)
        read_until(master, b"[stopped: the reply is not kept]")
        os.write(master, question.encode() + b"\n")
        read_until(master, b"(stop)")
        os.write(master, b"\x04")  # Ctrl-D
        assert chat.wait(timeout=60) == 0
        seen[chat.stdout.fileno()] += chat.stdout.read()
    finally:
        chat.kill()
        os.close(master)
    err, out = seen[master].decode(), seen[chat.stdout.fileno()].decode()
    assert out.endswith(f"\n{expected.text}\n") and expected.finish_reason == "stop"
    (turn,) = re.findall(r"\[(\d+) prompt tokens, \d+ of them cached, (\d+) generated \(stop\)", err)
    assert turn == (str(len(expected.prompt_token_ids)), str(len(expected.token_ids)))  # the stopped turn not kept


def test_a_model_without_a_tokenizer_is_a_usage_error(tmp_path):
    save_tiny_llama(tmp_path / "tiny")  # config and weights only
    code, out, err = run_cli("generate", "hi", "--model", str(tmp_path / "tiny"))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "ships no tokenizer: the command line needs one" in err


# -- the first-contact commands ---------------------------------------------------------------------------


def test_ci_runs_the_readme_test_command_verbatim():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    command = ci[-1]
    assert command.startswith("./scripts/setup.sh && ")
    assert f"```bash\n{command}\n```" in readme


# -- what a first start shows while it converts the GGUF -----------------------------------------------------


def test_conversion_progress_names_each_stage_and_ends_full(capsys, tmp_path):
    from minipic_lite.models.loader import CONVERSION_STAGES, conversion_progress

    with conversion_progress(tmp_path / "model.gguf", tmp_path / "cache") as next_stage:
        for _ in CONVERSION_STAGES:
            next_stage()
    err = capsys.readouterr().err
    assert err.startswith(f"minipic_lite: first start of model.gguf: converting it once into {tmp_path / 'cache'}")
    assert all(stage in err for stage in CONVERSION_STAGES)
    assert f"{len(CONVERSION_STAGES)}/{len(CONVERSION_STAGES)} stages" in err
