"""Edges of the command line (cli.py) that test_cli leaves open, in-process (no model): the limits of each checked
option are taken and one past them is refused, a prompt from standard input or a file loses its trailing line ends
only, the defaults, every option's help saying what it is, the help naming every exit status; and, with stand-ins for
the LLM and the web app's serve(), what each flag hands on, the exit status of an interrupt or a missing extra, of a
reply written into a pipe whose reader has left, and an address the app cannot listen on refused before it loads."""

import io
import itertools
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from minipic_lite import cli
from minipic_lite.cli import EXIT_INTERRUPTED, EXIT_RUN_ERROR, EXIT_USAGE, build_parser, read_prompt
from minipic_lite.sampling_params import SEED_MAX, SEED_MIN, SamplingParams


def parse(*args: str):
    return build_parser().parse_args(["generate", "hi", *args])


@pytest.mark.parametrize(
    ("flag", "text", "value"),
    [
        ("--temperature", "0", 0.0),
        ("--top-p", "1", 1.0),
        ("--top-k", "0", 0),
        ("--top-k", "-1", -1),  # vLLM's spelling of no cut, as SamplingParams takes it
        ("--max-tokens", "1", 1),
        ("--min-p", "0", 0.0),
        ("--min-p", "1", 1.0),
        ("--presence-penalty", "-2", -2.0),
        ("--frequency-penalty", "2", 2.0),
        ("--repetition-penalty", "1e-3", 1e-3),
        ("--seed", str(SEED_MIN), SEED_MIN),
        ("--seed", str(SEED_MAX), SEED_MAX),
        ("--device", "cuda:1", "cuda:1"),
    ],
)
def test_the_limits_of_an_option_are_taken(flag, text, value):
    assert getattr(parse(flag, text), flag.removeprefix("--").replace("-", "_")) == value


@pytest.mark.parametrize(
    ("flag", "text", "rule"),
    [
        ("--temperature", "inf", "a number >= 0 (0 = greedy)"),
        ("--seed", str(SEED_MIN - 1), "an integer in [-2**63, 2**64 - 1]"),
        ("--device", "cuda:", "auto, cpu, cuda or cuda:N"),
        ("--device", "cpu0", "auto, cpu, cuda or cuda:N"),
        ("--top-p", "1.5", "a number in (0, 1]"),
        ("--min-p", "1.01", "a number in [0, 1]"),
        ("--repetition-penalty", "0", "a number > 0 (1 = none)"),
        ("--repetition-penalty", "nan", "a number > 0 (1 = none)"),
        ("--presence-penalty", "2.5", "a number in [-2, 2]"),
        ("--frequency-penalty", "-3", "a number in [-2, 2]"),
        ("--stop", "", "a non-empty string"),
    ],
)
def test_one_past_the_limits_of_an_option_is_a_usage_error(flag, text, rule, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(flag, text)
    assert exit_info.value.code == EXIT_USAGE
    assert f"{flag}: must be {rule}, got {text!r}" in capsys.readouterr().err


@pytest.mark.parametrize(("port", "ok"), [("1", True), ("65535", True), ("0", False), ("65536", False)])
def test_the_ui_port_is_one_to_65535(port, ok, capsys):
    if ok:
        assert build_parser().parse_args(["ui", "--port", port]).port == int(port)
        return
    with pytest.raises(SystemExit):
        build_parser().parse_args(["ui", "--port", port])
    assert f"--port: must be a port number in 1..65535, got '{port}'" in capsys.readouterr().err


def test_file_dash_reads_standard_input_and_only_trailing_line_ends_are_dropped(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("  two\r\nlines \r\n\r\n"))
    assert read_prompt(SimpleNamespace(prompt=None, file="-")) == "  two\r\nlines "


def test_a_file_prompt_keeps_its_inner_and_leading_space(tmp_path):
    path = tmp_path / "q.txt"
    path.write_bytes(b"\tindented\r\n")
    assert read_prompt(SimpleNamespace(prompt=None, file=str(path))) == "\tindented"


def test_the_defaults_are_those_the_help_and_the_readme_name():
    """generate: 128 tokens, greedy, no top-p/top-k cut, no seed, no stop, auto device and dtype; ui: the README's
    http://127.0.0.1:7860 (loopback only, never every interface), the inline span policy, auto dtype."""
    gen = vars(parse())
    assert {k: gen[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos")} == {
        "max_tokens": 128, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None, "stop": [], "ignore_eos": False
    }  # fmt: skip
    penalties = ("min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
    assert [gen[k] for k in penalties] == [getattr(SamplingParams(), k) for k in penalties] == [0.0, 1.0, 0.0, 0.0]
    assert [gen[k] for k in ("device", "dtype", "raw", "stream", "model")] == ["auto", "auto", False, False, None]
    ui = build_parser().parse_args(["ui"])
    assert (ui.host, ui.port, ui.span_policy, ui.dtype, ui.model) == ("127.0.0.1", 7860, "inline", "auto", None)


def test_generate_help_names_every_exit_status_main_returns(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    named = f"0 done, {EXIT_RUN_ERROR} the run failed, {EXIT_USAGE} a usage error, {EXIT_INTERRUPTED} interrupted."
    assert f"Exit status: {named}" in help_text


def test_ctrl_c_during_a_run_is_one_line_and_exit_130(monkeypatch, capsys):
    """An interrupt while the model loads or generates: the shell's 128 + SIGINT status, no traceback."""

    def interrupted(args, prompt_text):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "check_model", lambda model: None)
    monkeypatch.setattr(cli, "run_generate", interrupted)
    assert cli.main(["generate", "hi"]) == 130
    assert capsys.readouterr().err == "minipic-lite generate: error: interrupted\n"


def fake_ui(monkeypatch, serve, listen=False):
    """`minipic-lite ui` imports ui.__main__.serve only when run: a stand-in module takes its place (no gradio); the
    check that the address is free is skipped unless `listen`."""
    monkeypatch.setitem(sys.modules, "ui.__main__", SimpleNamespace(serve=serve))
    if not listen:
        monkeypatch.setattr(cli, "check_listen", lambda host, port: None)


def refuse_to_serve(*args):
    raise AssertionError("the app was started: the address should have been refused first")


def test_a_busy_port_is_a_usage_error_before_the_model_loads(monkeypatch, capsys):
    """Before this check the model loaded (13 s) and then Gradio said 'Cannot find empty port ... set
    GRADIO_SERVER_PORT or pass server_port to launch()': knobs this command does not have."""
    fake_ui(monkeypatch, refuse_to_serve, listen=True)
    monkeypatch.setattr(cli, "check_model", lambda model: None)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["ui", "--port", str(port)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"minipic-lite ui: error: cannot listen on 127.0.0.1:{port}: ") and err.count("\n") == 1
    assert "pick another with --port" in err and "(see minipic-lite ui --help)" in err


def test_a_port_whose_last_connection_waits_in_time_wait_is_not_busy():
    """An app just stopped (uvicorn, which sets SO_REUSEADDR) leaves its closed connections in TIME_WAIT on its
    port; the next uvicorn binds over them, so check_listen must take that port, not refuse it as busy."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's listener
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            conn, _ = server.accept()
            conn.close()  # the server's end closes first: it is the one left in TIME_WAIT
            client.recv(1)  # the server's FIN has arrived
    cli.check_listen("127.0.0.1", port)  # no UsageError


def test_a_host_that_is_not_this_machines_is_a_usage_error_before_the_model_loads(monkeypatch, capsys):
    """192.0.2.1 is TEST-NET-1 (RFC 5737), an address no machine of ours holds: bind() refuses it at once."""
    fake_ui(monkeypatch, refuse_to_serve, listen=True)
    monkeypatch.setattr(cli, "check_model", lambda model: None)
    assert cli.main(["ui", "--host", "192.0.2.1"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("minipic-lite ui: error: cannot listen on 192.0.2.1:7860: ") and err.count("\n") == 1


def test_version_from_a_checkout_that_is_not_installed_says_so(monkeypatch, capsys):
    """Run from a source tree (PYTHONPATH, no `pip install`), --version has no distribution to read: it says so and
    exits 0 instead of a PackageNotFoundError traceback."""
    import importlib.metadata

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == "minipic-lite (not installed)\n"


def test_a_host_name_that_cannot_be_a_name_is_a_usage_error_naming_it(monkeypatch, capsys):
    """An empty label ("a..b") fails in the resolver's IDNA step (a UnicodeError, not socket.gaierror), before any
    lookup: one line naming the host, exit 2, not a traceback."""
    fake_ui(monkeypatch, refuse_to_serve, listen=True)
    monkeypatch.setattr(cli, "check_model", lambda model: None)
    assert cli.main(["ui", "--host", "a..b"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("minipic-lite ui: error: cannot listen on --host 'a..b': ") and err.count("\n") == 1
    assert "label empty or too long" in err


def test_ui_passes_every_option_to_serve_and_auto_dtype_as_none(monkeypatch):
    calls = []
    fake_ui(monkeypatch, lambda *args: calls.append(args) or 0)
    assert cli.main(["ui", "--host", "0.0.0.0", "--port", "8000", "--span-policy", "isps", "--dtype", "bfloat16"]) == 0
    assert cli.main(["ui"]) == 0
    assert calls == [("0.0.0.0", 8000, None, "isps", "bfloat16"), ("127.0.0.1", 7860, None, "inline", None)]


def test_a_missing_extra_is_one_line_exit_1_naming_the_module(monkeypatch, capsys):
    def serve(*args):
        raise ModuleNotFoundError("No module named 'gradio'", name="gradio")

    fake_ui(monkeypatch, serve)
    assert cli.main(["ui"]) == 1
    assert capsys.readouterr().err == (
        "minipic-lite ui: error: 'gradio' is not installed: run ./scripts/setup.sh (see the README)\n"
    )


def test_generate_hands_device_and_dtype_to_the_llm_and_auto_as_none(monkeypatch, capsys):
    """Stops at LLM(...) (a stand-in that records and refuses): nothing loads."""
    import minipic_lite

    calls = []

    def recording_llm(model, **kwargs):
        calls.append((model, kwargs))
        raise ValueError("stand-in")

    monkeypatch.setattr(cli, "check_model", lambda model: None)
    monkeypatch.setattr(minipic_lite, "LLM", recording_llm)
    assert cli.main(["generate", "hi", "--model", "m.gguf", "--device", "cuda:1", "--dtype", "bfloat16"]) == 1
    assert cli.main(["generate", "hi"]) == 1
    assert calls == [("m.gguf", {"device": "cuda:1", "dtype": "bfloat16"}), (None, {"device": None, "dtype": None})]
    assert capsys.readouterr().err == "minipic-lite generate: error: stand-in\n" * 2


class RecordingLLM:
    """Stands in for LLM in `generate`: records the prompt and params it is asked for, replies "ok" (streamed: at
    once)."""

    calls: list = []

    def __init__(self, model, device, dtype):
        self.tokenizer = object()

    def generate(self, prompts, params, use_tqdm):
        RecordingLLM.calls.append((prompts, params, use_tqdm))
        metrics = SimpleNamespace(ttft=0.01, total_time=0.02)
        reply = SimpleNamespace(index=0, text="ok", token_ids=[3], finish_reason="length")
        return [SimpleNamespace(text="ok", prompt_token_ids=[1, 2], token_ids=[3], finish_reason="length",
                                metrics=metrics, finished=True, outputs=[reply])]  # fmt: skip

    def stream(self, prompt, params, request_id=None):
        yield from self.generate([prompt], params, False)

    def stats(self):  # the prefill bar's poll
        return {"prefill_progress": {}}


def test_generate_hands_every_sampling_flag_to_the_params(monkeypatch, capsys):
    """Every sampling flag (and no flag: the defaults) reaches SamplingParams; the reply goes to stdout, and the
    summary line on stderr counts the tokens and times the load as the clock around LLM(...) says."""
    import minipic_lite
    from minipic_lite import SamplingParams

    monkeypatch.setattr(cli, "check_model", lambda model: None)
    monkeypatch.setattr(minipic_lite, "LLM", RecordingLLM)
    monkeypatch.setattr(RecordingLLM, "calls", [])
    # the clock read before and after LLM(...) of each run: the first loads in 2.5 s
    monkeypatch.setattr(cli, "time", SimpleNamespace(perf_counter=iter([100.0, 102.5, 200.0, 200.0]).__next__))
    flags = ["--max-tokens", "7", "--temperature", "0.5", "--top-p", "0.9", "--top-k", "3", "--seed", "11",
             "--min-p", "0.05", "--repetition-penalty", "1.2", "--presence-penalty", "0.5", "--frequency-penalty",
             "-0.5", "--min-tokens", "2"]  # fmt: skip
    assert cli.main(["generate", "--raw", "hi", *flags, "--stop", "a", "--stop", "b", "--ignore-eos"]) == 0
    assert cli.main(["generate", "hi"]) == 0
    expected = SamplingParams(max_tokens=7, temperature=0.5, top_p=0.9, top_k=3, seed=11, stop=["a", "b"],
                              ignore_eos=True, min_p=0.05, repetition_penalty=1.2, presence_penalty=0.5,
                              frequency_penalty=-0.5, min_tokens=2)  # fmt: skip
    assert RecordingLLM.calls == [
        (["hi"], expected, False),
        ([[{"role": "user", "content": "hi"}]], SamplingParams(max_tokens=128, temperature=0.0), False),
    ]
    out, err = capsys.readouterr()
    assert out == "ok\nok\n"
    assert err.splitlines()[0] == "[2 prompt tokens, 1 generated (length); load 2.5 s, ttft 10 ms, total 0.02 s]"


# Runs the CLI's main() in a fresh interpreter with RecordingLLM in place of the LLM (nothing loads).
STAND_IN_CLI = """
import sys
import minipic_lite
from minipic_lite import cli
from tests.test_cli_edges import RecordingLLM
minipic_lite.LLM = RecordingLLM
cli.check_model = lambda model: None
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("flags", [[], ["--stream"]], ids=["printed", "streamed"])
def test_a_reply_into_a_pipe_whose_reader_has_left_exits_1_saying_nothing(flags):
    """`minipic-lite generate ... | head -c 1`, head gone before the reply: exit 1 and nothing on stderr, no traceback
    and no "Exception ignored" at exit. stdout is a real pipe whose read end is closed before the CLI starts, and
    block-buffered as a shell gives it (PYTHONUNBUFFERED unset): a printed reply left in the buffer would only fail as
    the interpreter exits, outside main's `except BrokenPipeError` (exit 120)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run([sys.executable, "-c", STAND_IN_CLI, "generate", "hi", *flags], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, cwd=root, env=env, timeout=60)  # fmt: skip
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (EXIT_RUN_ERROR, "")


@pytest.mark.parametrize("command", ["generate", "ui"])
def test_every_option_of_a_command_says_what_it_is_not_only_its_default(command):
    """`minipic-lite ui --help` read "--port PORT  default: 7860" and "--span-policy ...  default: inline"."""
    actions = build_parser().commands[command]._actions
    bare = [a.option_strings[-1] for a in actions if a.option_strings and (a.help or "").startswith("default")]
    assert bare == []


def test_the_prefill_bar_counts_the_prompt_tokens_in_the_cache_until_the_first_token(model_dir, monkeypatch):
    """run_generate's wiring over 64-token steps held 0.2 s each. A stream's bar, forced on, shows 64, 128, ... of the
    prompt's tokens, never all of them, and is cleared when the first output's callback returns (before any text is
    printed). Around a `generate` (no stream: no callback) the bar ends by itself at the first token, while the
    decode goes on; where stderr is no terminal it draws nothing. The answers are the ones `generate` gives."""
    import re
    import time

    import minipic_lite as mp

    monkeypatch.setattr(cli, "PREFILL_POLL_SECONDS", 0.05)
    llm = mp.LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=2048, max_num_batched_tokens=64)
    prompt, params = " ".join(f"item {i}," for i in range(100)), mp.SamplingParams(max_tokens=3, temperature=0.0)
    polling = lambda: [t for t in threading.enumerate() if t.name == "prefill-bar"]  # noqa: E731
    try:
        step = llm.engine.step

        def slow_step():
            time.sleep(0.2)
            return step()

        monkeypatch.setattr(llm.engine, "step", slow_step)
        file = io.StringIO()
        with cli.prefill_bar(llm, delay=0, file=file, disable=False) as first_output:
            outputs = llm.stream(prompt, params)
            output = next(outputs)
            first_output()  # NOTE: as stream_to_stdout
            shown, polled_on = file.getvalue(), polling()
            *_, output = itertools.chain([output], outputs)
        expected = llm.generate(prompt, params, use_tqdm=False)[0]  # NOTE: its prompt's blocks cached by now
        alone, longer = io.StringIO(), mp.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        with cli.prefill_bar(llm, delay=0, file=alone, disable=False):  # NOTE: no stream: no callback
            generated = llm.generate(prompt.replace("item", "line"), longer, use_tqdm=False)[0]
            polled_after_generate = polling()
        not_a_terminal = io.StringIO()  # as stderr piped or redirected: disable=None turns the bar off
        with cli.prefill_bar(llm, delay=0, file=not_a_terminal):
            llm.generate(prompt.replace("item", "thing"), params, use_tqdm=False)
    finally:
        llm.close()
    n = len(output.prompt_token_ids)
    counts = [int(done) for done, total in re.findall(r"(\d+)/(\d+) \[", file.getvalue()) if int(total) == n]
    assert n > 4 * 64 and len(set(counts)) >= 3 and counts == sorted(counts), file.getvalue()
    assert polled_on == [] and shown == file.getvalue() and shown.endswith("\r") and not shown.split("\r")[-2].strip()
    assert all(count % 64 == 0 and count < n for count in counts)
    assert output.finished and output.token_ids == expected.token_ids and len(output.token_ids) == 3
    alone_counts = [int(done) for done, _ in re.findall(r"(\d+)/(\d+) \[", alone.getvalue())]
    assert polled_after_generate == [] and len(set(alone_counts)) >= 3 and alone.getvalue().endswith("\r")
    assert len(generated.token_ids) == 8 and not_a_terminal.getvalue() == ""
