"""`python -m ui [--host 127.0.0.1] [--port 7860] [--model PATH] [--span-policy inline|isps|barrier] [--dtype D]`:
load the model, serve the app (no share link)."""

from __future__ import annotations

import argparse
import sys

from minipic_lite.config import DTYPES, SPAN_POLICIES

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860


def serve(
    host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, model: str | None = None, span_policy="inline", dtype=None
) -> int:
    import minipic_lite as mp
    from ui import build_demo

    print(f"loading {model or 'the default model (SmolLM2-135M-Instruct)'} ...", file=sys.stderr)
    demo = build_demo(mp.LLM(model, span_policy=span_policy, dtype=dtype))
    print(f"open http://{host}:{port} in a browser (Ctrl-C stops the app)", file=sys.stderr)
    demo.queue().launch(server_name=host, server_port=port, share=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ui", description="Serve the minipic_lite web app.")
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="default: %(default)s")
    parser.add_argument("--model", help="a .gguf file or a local Hugging Face directory (default: SmolLM2)")
    parser.add_argument("--span-policy", choices=SPAN_POLICIES, default="inline", help="default: %(default)s")
    parser.add_argument("--dtype", choices=DTYPES, help="default: bfloat16 on CUDA, float32 on the CPU")
    args = parser.parse_args(argv)
    return serve(args.host, args.port, args.model, args.span_policy, args.dtype)


if __name__ == "__main__":
    sys.exit(main())
