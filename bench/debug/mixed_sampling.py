"""Debug (GPU): a CUDA-graph engine with bursts, greedy and sampled requests in one batch (next33e's failing test)."""

import sys
import tempfile
import traceback

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import minipic_lite as mp

config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=512, max_position_embeddings=512)  # fmt: skip
torch.manual_seed(0)
path = tempfile.mkdtemp()
LlamaForCausalLM(config).save_pretrained(path)
llm = mp.LLM(path, device="cuda", dtype=sys.argv[1], max_model_len=256, max_num_seqs=8, num_blocks=256,
             num_scheduler_steps=4)  # fmt: skip
runner = llm.engine.runner
execute, sample = runner.execute, runner.sampler.__call__


def traced_sample(logits, batch):
    out = sample(logits, batch)
    print("sample", tuple(logits.shape), logits.dtype, batch.is_all_greedy, "->", tuple(out.shape), out.dtype)
    return out


def traced_execute(out):
    rows = execute(out)
    print("execute", [[type(t).__name__ for t in r] for r in rows][:2], rows[:2])
    return rows


runner.execute = traced_execute
runner.sampler = type("S", (), {"__call__": staticmethod(traced_sample), "prepare": runner.sampler.prepare,
                                "forget": runner.sampler.forget})()  # fmt: skip
greedy = mp.SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
sampled = mp.SamplingParams(max_tokens=6, temperature=0.7, seed=3, ignore_eos=True)
try:
    outs = llm.generate([[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]], [greedy, sampled, greedy], use_tqdm=False)
    print("ok", [o.token_ids for o in outs])
except Exception:
    traceback.print_exc()
