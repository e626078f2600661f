"""Edges of the command line (cli.py) that test_cli leaves open, in-process (no model): the limits of each checked
option are taken and one past them is refused, and a prompt from standard input or a file loses its trailing line
ends only."""

import io
from types import SimpleNamespace

import pytest

from minipic_lite.cli import EXIT_USAGE, build_parser, read_prompt
from minipic_lite.sampling_params import SEED_MAX, SEED_MIN


def parse(*args: str):
    return build_parser().parse_args(["generate", "hi", *args])


@pytest.mark.parametrize(
    ("flag", "text", "value"),
    [
        ("--temperature", "0", 0.0),
        ("--top-p", "1", 1.0),
        ("--top-k", "0", 0),
        ("--max-tokens", "1", 1),
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
