"""`minipic-lite generate "..."`: one generation on the default (or a given) model."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minipic-lite")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a reply to a prompt (chat template applied)")
    gen.add_argument("prompt")
    gen.add_argument("--model", default=None, help="a .gguf file or a local Hugging Face directory")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--device", default=None)
    gen.add_argument("--raw", action="store_true", help="no chat template: continue the text as is")
    args = parser.parse_args(argv)

    from minipic_lite import LLM, SamplingParams

    llm = LLM(args.model, device=args.device)
    prompt = args.prompt if args.raw else [{"role": "user", "content": args.prompt}]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
    (output,) = llm.generate([prompt], params, use_tqdm=False)
    print(output.text)
    m = output.metrics
    print(
        f"[{len(output.token_ids)} tokens, ttft {m.ttft * 1e3:.0f} ms, total {m.total_time:.2f} s]",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
