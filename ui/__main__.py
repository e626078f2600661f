"""`python -m ui [options]`, the same as `minipic-lite ui [options]` (`--help` lists them): load the model, serve the
app (no share link)."""

from __future__ import annotations

import sys

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860
# NOTE: one engine step serves every user: at the library's 2,048-token budget a CPU step of prefill took ~13 s here
# (a 3,800-token prompt: 26.6 s in two steps, 2-core AMD EPYC), and another user's question, or a Stop, waited for
# it. At 512 the same prompt took 27.2 s in eight steps, each ~3.4 s, between which others' tokens are served (two
# runs each, another process sharing the cores).
APP_STEP_TOKENS = 512


def serve(
    host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, model: str | None = None, span_policy="inline", dtype=None
) -> int:
    import minipic_lite as mp
    from ui import build_demo

    print(f"loading {model or 'the default model (SmolLM2-135M-Instruct)'} ...", file=sys.stderr)
    llm = mp.LLM(model, span_policy=span_policy, dtype=dtype, max_num_batched_tokens=APP_STEP_TOKENS)
    demo = build_demo(llm)
    # NOTE: quiet: Gradio's own lines would suggest share=True, which this app never sets (it serves locally)
    demo.queue().launch(server_name=host, server_port=port, share=False, quiet=True, prevent_thread_lock=True)
    print(f"serving on http://{host}:{port}: open it in a browser (Ctrl-C stops the app)", file=sys.stderr)
    demo.block_thread()
    return 0


def main(argv: list[str] | None = None) -> int:
    """The console script's `ui` command (minipic_lite/cli.py): the same options, checks and messages."""
    from minipic_lite.cli import main as cli_main

    return cli_main(["ui", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
