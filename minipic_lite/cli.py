"""`minipic-lite generate "..."`: one generation on the default (or a given) model, from the shell; `minipic-lite
chat`: a conversation, a line of standard input a message; `minipic-lite ui`: the web app.

A well-behaved Unix tool: every argument is checked before the model loads (torch and transformers are
imported only then, so `--help` is instant), a user error prints one line and exits non-zero (2 for
usage errors, 1 when the run itself fails, e.g. a prompt longer than the context), a long prompt comes
from a file or standard input instead of the command line, and its prefill shows a progress bar on a terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import sys
import threading
import time

from minipic_lite.config import SPAN_POLICIES
from minipic_lite.sampling_params import SEED_MAX, SEED_MIN

PROG = "minipic-lite"
EXIT_RUN_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
DTYPES = ("auto", "float32", "bfloat16", "float16")
DTYPE_HELP = (
    "the model's dtype (default: %(default)s = bfloat16 on CUDA, float32 on the CPU; bfloat16 there: 1.1-1.5x faster "
    "on CPUs with AVX512-BF16 or AMX, its greedy tokens part from float32's at near ties)"
)
EXAMPLES = "\n  ".join([
    "examples:",
    f'{PROG} generate "Write a haiku about caches."',
    f"{PROG} generate --file question.txt --max-tokens 256",
    f"cat question.txt | {PROG} generate - --stream",
    f'{PROG} generate --model ./Qwen2.5-0.5B-Instruct --device cuda "Hello"',
])  # fmt: skip


class UsageError(Exception):
    """A bad command line, found before anything loads: one line, exit 2."""


class Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (argparse prints the usage block first), exit 2."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.commands: dict[str, argparse.ArgumentParser] = {}  # the subcommands' parsers by name (the top level's)

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        """argparse's, but an option that a command does not know is named by that command's parser, whose --help
        lists its options (argparse names the top level, whose --help lists only the commands)."""
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self.commands.get(getattr(parsed, "command", None), self).error(
                f"unrecognized arguments: {' '.join(unknown)}"
            )
        return parsed


def checked(kind: type, rule: str, ok=lambda value: True):
    """An argparse type: `kind(text)` where `ok(value)` holds; else one line that names the rule."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        return value

    return parse


def build_parser() -> Parser:
    parser = Parser(prog=PROG, description="A compact, teachable LLM inference engine (MiniPIC caching).")
    parser.add_argument("--version", action="version", version=f"{PROG} {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    gen = sub.add_parser(
        "generate",
        help="generate a reply to a prompt",
        description="Generate a reply to a prompt. The prompt is sent as a chat message (the model's chat\n"
        "template) unless --raw is given. The reply goes to standard output, a one-line summary to\n"
        "standard error (on a terminal, after a progress bar of a prefill that takes over a second).\n"
        "Exit status: 0 done, 1 the run failed, 2 a usage error, 130 interrupted.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = gen.add_argument_group("prompt (give exactly one)")
    source.add_argument("prompt", nargs="?", help="the prompt text; '-' reads it from standard input")
    source.add_argument("-f", "--file", metavar="PATH", help="read the prompt from a file (UTF-8; '-' = stdin)")
    gen.add_argument("--raw", action="store_true", help="no chat template: continue the text as it is")
    add_model_arguments(gen)
    add_sampling_arguments(gen)
    replies = checked(int, "an integer >= 1", lambda v: v >= 1)
    gen.add_argument("-n", type=replies, default=1, metavar="N",
                     help="sample N replies of the prompt, reply i with --seed + i (default: 1)")  # fmt: skip
    gen.add_argument("--stream", action="store_true", help="print the reply as it is generated")
    talk = sub.add_parser(
        "chat",
        help="chat with the model in the terminal",
        description="Chat with the model: a line of standard input is a message, the reply goes to standard\n"
        "output as it is generated, and a line per turn to standard error (prompt tokens, those found\n"
        "in the prefix cache: the turns before, at least, time to the first token). /reset starts a new\n"
        "conversation; Ctrl-C stops a reply (not kept), end of input (Ctrl-D) or /exit ends.\n"
        "Exit status as generate's.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    talk.add_argument("--system", metavar="TEXT", help="a system message first (default: none)")
    add_model_arguments(talk)
    add_sampling_arguments(talk)
    app = sub.add_parser(
        "ui", help="serve the web app (needs the [ui] extra)", description="Serve the web app (no share link)."
    )
    app.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    port = checked(int, "a port number in 1..65535", lambda v: 1 <= v <= 65535)
    app.add_argument("--port", type=port, default=7860, help="port to listen on (default: %(default)s)")
    app.add_argument("--model", metavar="PATH", help="a .gguf file or a Hugging Face directory (default SmolLM2)")
    policy_help = "when documents' spans are computed (README: Reuse documents anywhere; default: %(default)s)"
    app.add_argument("--span-policy", choices=SPAN_POLICIES, default="inline", help=policy_help)
    app.add_argument("--dtype", choices=DTYPES, default="auto", help=DTYPE_HELP)
    parser.commands = sub.choices
    return parser


def add_model_arguments(command: argparse.ArgumentParser) -> None:
    model = command.add_argument_group("model")
    model.add_argument("--model", metavar="PATH", help="a .gguf file or a local Hugging Face directory "
                       "(default: the embedded SmolLM2-135M-Instruct)")  # fmt: skip
    device = checked(str, "auto, cpu, cuda or cuda:N", re.compile(r"auto|cpu|cuda(:\d+)?").fullmatch)
    model.add_argument(
        "--device",
        type=device,
        default="auto",
        help="auto, cpu, cuda or cuda:N (default: %(default)s = cuda when torch sees a GPU)",
    )
    model.add_argument("--dtype", choices=DTYPES, default="auto", help=DTYPE_HELP)


def add_sampling_arguments(command: argparse.ArgumentParser) -> None:
    sampling = command.add_argument_group("sampling")
    temperature = checked(float, "a number >= 0 (0 = greedy)", lambda v: 0 <= v < float("inf"))
    seed = checked(int, "an integer in [-2**63, 2**64 - 1]", lambda v: SEED_MIN <= v <= SEED_MAX)
    min_p = checked(float, "a number in [0, 1]", lambda v: 0 <= v <= 1)
    repetition = checked(float, "a number > 0 (1 = none)", lambda v: 0 < v < float("inf"))
    penalty = checked(float, "a number in [-2, 2]", lambda v: -2 <= v <= 2)
    for flag, kind, default, metavar, help_ in [
        ("--max-tokens", checked(int, "an integer >= 1", lambda v: v >= 1), 128, "N", "new tokens at most"),
        ("--temperature", temperature, 0.0, "T", "0 = greedy"),
        ("--top-p", checked(float, "a number in (0, 1]", lambda v: 0 < v <= 1), 1.0, "P", "nucleus sampling"),
        ("--top-k", checked(int, "an integer >= -1", lambda v: v >= -1), 0, "K", "0 or -1 = no cut"),
        ("--min-p", min_p, 0.0, "P", "drop tokens less likely than P times the likeliest"),
        ("--repetition-penalty", repetition, 1.0, "R", "> 1 discourages the prompt's and output's tokens (greedy too)"),
        ("--presence-penalty", penalty, 0.0, "X", "subtracted once from each token already in the output"),
        ("--frequency-penalty", penalty, 0.0, "X", "subtracted per occurrence in the output"),
        ("--seed", seed, None, "S", "seed for sampling"),
        ("--min-tokens", checked(int, "an integer >= 0", lambda v: v >= 0), 0, "N", "no stop before N new tokens"),
    ]:
        sampling.add_argument(
            flag, type=kind, default=default, metavar=metavar, help=f"{help_} (default: %(default)s)".lstrip()
        )
    nonempty = checked(str, "a non-empty string", bool)
    sampling.add_argument("--stop", type=nonempty, action="append", default=[], metavar="TEXT",
                          help="stop before this text (repeat for several)")  # fmt: skip
    sampling.add_argument("--ignore-eos", action="store_true", help="generate --max-tokens whatever the model says")


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("minipic-lite")
    except PackageNotFoundError:
        return "(not installed)"


def read_prompt(args) -> str:
    """The prompt text from the argument, a file or standard input; trailing newlines dropped."""
    if (args.prompt is None) == (args.file is None):
        raise UsageError("give a prompt, '-' to read standard input, or --file PATH (exactly one)")
    if args.prompt == "-" or args.file == "-":
        try:
            text = sys.stdin.read()
        except UnicodeDecodeError as e:  # NOTE: a UTF-8 locale reads strictly; the C locale escapes such bytes
            raise UsageError(f"cannot read standard input: {e}") from None
    elif args.file is not None:
        try:
            with open(args.file, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read --file {args.file!r}: {getattr(e, 'strerror', None) or e}") from None
    else:
        text = args.prompt
    from minipic_lite.prompts import check_unicode

    try:
        check_unicode(text, "the prompt")  # NOTE: escaped bytes from standard input or the command line
    except ValueError as e:
        raise UsageError(str(e)) from None
    text = text.rstrip("\r\n")
    if not text.strip():
        raise UsageError("the prompt is empty")
    return text


def check_model(model: str | None) -> None:
    """The model's files are there (nothing loads yet): a bad path is a usage error, found at once."""
    from minipic_lite.models.loader import model_source

    try:
        model_source(model)
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None


def check_listen(host: str, port: int) -> None:
    """The web app can listen on host:port (nothing loads yet): a busy port or a host that is not this machine's is a
    usage error, found at once, not after the model has loaded (where Gradio's message points at its own knobs)."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise UsageError(f"cannot listen on --host {host!r}: {getattr(e, 'strerror', None) or e}") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # NOTE: as uvicorn binds: TIME_WAIT is no clash
        try:
            probe.bind(address)
        except OSError as e:
            hint = ": pick another with --port" if e.errno == errno.EADDRINUSE else ""
            raise UsageError(f"cannot listen on {host}:{port}: {e.strerror}{hint}") from None


def load(args):
    """(the engine of --model / --device / --dtype, its load time, the sampling flags' SamplingParams)."""
    from minipic_lite import LLM, SamplingParams

    start = time.perf_counter()
    auto = lambda value: None if value == "auto" else value
    llm = LLM(args.model, device=auto(args.device), dtype=auto(args.dtype))
    load_time = time.perf_counter() - start
    if llm.tokenizer is None:
        raise UsageError(f"{llm.config.model_dir} ships no tokenizer: the command line needs one (Python: token ids)")
    names = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
             "frequency_penalty", "seed", "stop", "ignore_eos", "min_tokens")  # fmt: skip
    return llm, load_time, SamplingParams(**{k: getattr(args, k) for k in names}, n=getattr(args, "n", 1))


def run_generate(args, prompt_text: str) -> int:
    llm, load_time, params = load(args)
    prompt = prompt_text if args.raw else [{"role": "user", "content": prompt_text}]
    with prefill_bar(llm) as first_output:
        if args.stream:
            output = stream_to_stdout(llm.stream(prompt, params), first_output)
        else:  # NOTE: not a stream: the engine decodes the text once, at the end, not at every step
            output = llm.generate([prompt], params, use_tqdm=False)[0]
    for reply in output.outputs if not args.stream else ():
        if args.n > 1:
            print(f"--- reply {reply.index + 1} of {args.n} ---")
        print(reply.text)
    sys.stdout.flush()  # NOTE: a reader that left fails here, in main's try, not in the flush at exit (exit 120)
    m, replies = output.metrics, output.outputs
    generated = f"{len(output.token_ids)} generated ({output.finish_reason})"
    if args.n > 1:
        reasons = ", ".join(reply.finish_reason for reply in replies)
        generated = f"{sum(len(reply.token_ids) for reply in replies)} generated in {args.n} replies ({reasons})"
    print(
        f"[{len(output.prompt_token_ids)} prompt tokens, {generated}; "
        f"load {load_time:.1f} s, ttft {m.ttft * 1e3:.0f} ms, total {m.total_time:.2f} s]",
        file=sys.stderr,
    )
    return 0


def run_chat(args) -> int:
    """A conversation on standard input, a message a line: each reply streamed, a line per turn on stderr."""
    from minipic_lite.prompts import check_unicode

    # NOTE: a line of bytes that are no UTF-8 is then one error line, not the chat's end (a UTF-8 locale reads
    # standard input strictly; the C locale already escapes them)
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdin.reconfigure(errors="surrogateescape")
    llm, load_time, params = load(args)
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict] = []
    print(f"[loaded in {load_time:.1f} s; a message a line, /reset a new conversation, Ctrl-D ends]", file=sys.stderr)
    while True:
        line = read_message()
        message = (line or "").strip()
        if line is None or message == "/exit":
            return 0
        if message == "/reset":
            history = []
            print("[a new conversation]", file=sys.stderr)
            continue
        if not message:
            continue
        messages = [*system, *history, {"role": "user", "content": message}]
        try:
            check_unicode(message, "the message")
            outputs = llm.stream(messages, params)
        except ValueError as e:  # NOTE: refused before it ran (past the context, a marker's text): the chat goes on
            hint = " (/reset starts a new conversation)" if history else ""
            print(f"{PROG} chat: error: {str(e).removeprefix('prompt 0: ')}{hint}", file=sys.stderr)
            continue
        try:
            with prefill_bar(llm) as first_output:
                output = stream_to_stdout(outputs, first_output)
        except KeyboardInterrupt:  # NOTE: Ctrl-C in a reply stops it (the stream aborts its request); at the prompt
            print(flush=True)  # it ends the chat (main: exit 130)
            print("[stopped: the reply is not kept]", file=sys.stderr)
            continue
        history += [messages[-1], {"role": "assistant", "content": output.text}]
        print(
            f"[{len(output.prompt_token_ids)} prompt tokens, {output.num_cached_tokens} of them cached, "
            f"{len(output.token_ids)} generated ({output.finish_reason}); ttft {output.metrics.ttft * 1e3:.0f} ms]",
            file=sys.stderr,
        )


def read_message() -> str | None:
    """The next line of standard input (None at its end); on a terminal after a "> " prompt, with line editing where
    standard output is one too (input() writes its prompt there)."""
    if sys.stdin.isatty() and sys.stdout.isatty():
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401 -- input() then edits the line and keeps a history
        try:
            return input("> ")
        except EOFError:
            print()
            return None
    if sys.stdin.isatty():
        print("> ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline() or None


PREFILL_BAR_DELAY, PREFILL_POLL_SECONDS = 1.0, 0.25
STOP_BAR_TIMEOUT = 60.0  # NOTE: the poll waits at most a step (seconds on a CPU); an engine that died may never answer


@contextlib.contextmanager
def prefill_bar(llm, delay: float = PREFILL_BAR_DELAY, file=None, disable: bool | None = None):
    """A progress bar of the prompt tokens in the cache of the one request the command line's engine serves
    (`LLM.stats()["prefill_progress"]`), from a thread polling the engine, until the request has its first token, or
    the `with` block calls what it yields (a stream, at its first output, before printing it: the bar is cleared when
    the call returns), or ends. Shown once the prefill has taken `delay` seconds, and (disable=None) only where
    stderr is a terminal; it leaves no line behind.
    """
    from tqdm.auto import tqdm

    done = threading.Event()

    def poll() -> None:
        with tqdm(
            desc="prefill", unit="tok", file=file or sys.stderr, disable=disable, delay=delay, leave=False
        ) as bar:
            seen = False
            while not done.wait(PREFILL_POLL_SECONDS):
                try:
                    listed = llm.stats()["prefill_progress"]  # NOTE: waits for the step to end
                except Exception:  # noqa: BLE001 -- the engine stopped: the request's own stream says why
                    return
                progress = next(iter(listed.values()), None)
                if progress is None and seen:  # its first token came
                    return
                if progress is not None and not done.is_set():
                    seen, (_, count, bar.total) = True, progress
                    bar.update(count - bar.n)  # NOTE: update, not n and refresh: tqdm then clears what it drew

    def stop() -> None:  # NOTE: the bar cleared (by the thread's `with`) before the caller prints on its line
        done.set()
        thread.join(timeout=STOP_BAR_TIMEOUT)

    thread = threading.Thread(target=poll, name="prefill-bar", daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop()


def stream_to_stdout(outputs, first_output=lambda: None):
    """Print each new piece of text as it comes; returns the final output."""
    printed = ""
    for output in outputs:
        first_output()
        # NOTE: the text so far only grows (the engine holds back what may begin a stop string or an incomplete
        # character: engine.shown_text); a decode that rewrote earlier text is skipped, not printed wrong
        if output.text.startswith(printed) and len(output.text) > len(printed):
            sys.stdout.write(output.text[len(printed) :])
            sys.stdout.flush()
            printed = output.text
    print()
    return output


def user_error(message: str, code: int, prog: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    prog = f"{PROG} {args.command}"  # NOTE: every error names the command, as argparse's usage errors do
    try:
        if args.command == "ui":
            check_model(args.model)
            check_listen(args.host, args.port)
            from ui.__main__ import serve  # NOTE: gradio loads only for this command

            dtype = None if args.dtype == "auto" else args.dtype
            return serve(args.host, args.port, args.model, args.span_policy, dtype)
        if args.min_tokens > args.max_tokens:
            raise UsageError(f"--min-tokens {args.min_tokens} is more than --max-tokens {args.max_tokens}")
        if args.command == "chat":
            check_model(args.model)
            return run_chat(args)
        if args.stream and args.n > 1:
            raise UsageError("--stream prints one reply as it comes: drop it or -n")
        prompt_text = read_prompt(args)
        check_model(args.model)
        return run_generate(args, prompt_text)
    except UsageError as e:
        return user_error(f"{e} (see {prog} --help)", EXIT_USAGE, prog)
    except BrokenPipeError:  # `... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_RUN_ERROR
    except ModuleNotFoundError as e:
        return user_error(f"{e.name!r} is not installed: run ./scripts/setup.sh (see the README)", EXIT_RUN_ERROR, prog)
    except (ValueError, TypeError, OSError) as e:
        # NOTE: the engine names a batch's prompt by index; the CLI sends one.
        return user_error(str(e).removeprefix("prompt 0: "), EXIT_RUN_ERROR, prog)
    except KeyboardInterrupt:
        return user_error("interrupted", EXIT_INTERRUPTED, prog)


if __name__ == "__main__":
    sys.exit(main())
