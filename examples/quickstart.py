"""minipic_lite in a minute: generate, stream, and watch the prefix cache work.

python examples/quickstart.py
"""

import minipic_lite as mp

llm = mp.get_default_llm()  # the embedded SmolLM2-135M-Instruct, on the CPU unless a GPU is there
greedy = mp.SamplingParams(max_tokens=24, temperature=0.0)

question = [{"role": "user", "content": "Give me one tip for writing clear code."}]
first = llm.generate(question, greedy, use_tqdm=False)[0]
print(first.text)
print(f"time to first token {first.metrics.ttft * 1e3:.0f} ms, cached prompt tokens {first.num_cached_tokens}")

again = llm.generate(question, greedy, use_tqdm=False)[0]  # same prompt: its full blocks are cache hits
print(f"second run: cached prompt tokens {again.num_cached_tokens} of {len(again.prompt_token_ids)}")
block_size = llm.config.cache.block_size  # every full block but the one holding the last prompt token is a hit
assert again.num_cached_tokens == (len(again.prompt_token_ids) - 1) // block_size * block_size > 0
assert again.token_ids == first.token_ids

shown = ""
for partial in llm.stream("Once upon a time", mp.SamplingParams(max_tokens=12, temperature=0.0)):
    print(partial.text[len(shown) :], end="", flush=True)  # each step's new text (partial.text is all of it so far)
    shown = partial.text
print()
print(llm.stats())
