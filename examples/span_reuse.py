"""Position-independent caching: documents cached once are reused in any order, at any offset.

python examples/span_reuse.py
"""

import minipic_lite as mp

llm = mp.get_default_llm()
composer = llm.composer
docs = [
    "The Amazon river carries more water than any other river on Earth.",
    "The Nile is usually listed as the longest river, at about 6,650 km.",
    "Rivers shape valleys by eroding rock and carrying sediment to the sea.",
]

# 1. Warm the cache with each document on its own (an SSEP span: it sees only itself).
llm.generate(composer.span_prompts("block_attention", docs), mp.SamplingParams(max_tokens=1), use_tqdm=False)

# 2. Ask with the documents in another order, behind a system prompt: every document block is a hit.
prompt = composer.block_attention("Answer from the documents.", docs[::-1], "Which river is the longest?")
out = llm.generate(prompt, mp.SamplingParams(max_tokens=24, temperature=0.0), use_tqdm=False)[0]
print(out.text)
print(mp.format_report(out.cache_report))
totals = mp.report_totals(out.cache_report)
print(totals)
assert all(block.is_hit for block in out.cache_report if block.label.startswith("doc"))
