"""The CUDA-graph buckets without a GPU: which shapes are captured, which one a step takes, how it is padded.
(Replay against eager runs on the GPU: tests/test_gpu.py.)"""

import pytest
import torch

import minipic_lite as mp
from minipic_lite.cuda_graphs import StaticInputs, StepGraphs, graph_shapes, padding_lens, pick_shape
from minipic_lite.models import llama
from minipic_lite.models.step import HostStep, StepMetadata
from tests.conftest import save_tiny_llama

SHAPES = graph_shapes((1, 2, 4, 8, 16), max_num_seqs=8, token_sizes=(16, 32, 64, 128), max_tokens_per_seq=8)


def test_graph_shapes_are_decode_buckets_and_prefill_buckets_sorted_by_tokens():
    assert SHAPES == [
        (1, 1), (2, 2), (4, 4), (8, 8),  # decode: one token per sequence, up to max_num_seqs
        (2, 16), (4, 16), (8, 16), (9, 16),  # prefill: 1 < S < T <= 8 S, S up to max_num_seqs + 1
        (4, 32), (8, 32), (9, 32),
        (8, 64), (9, 64),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "num_seqs, num_tokens, expected",
    [
        (1, 1, (1, 1)),  # a lone decode
        (3, 3, (4, 4)),  # decodes padded by one sequence of one token
        (8, 8, (8, 8)),
        (1, 2, (2, 16)),  # a prefill of two tokens: a padding sequence takes the other 14
        (1, 15, (2, 16)),
        (1, 16, (4, 32)),  # 16 real tokens leave no token for the padding sequence of (2, 16)
        (2, 16, (2, 16)),  # an exact fit needs no padding sequence
        (3, 13, (4, 16)),  # 3 padding tokens for 1 padding sequence
        (8, 9, (9, 16)),  # a full batch with a prefill: the bucket past max_num_seqs has the padding sequence
        (7, 40, (8, 64)),
        (1, 64, None),  # past every bucket: eager
        (10, 10, None),  # more sequences than any bucket
    ],
)
def test_pick_shape_takes_the_fewest_padded_tokens_that_leave_a_token_per_padding_sequence(
    num_seqs, num_tokens, expected
):
    assert pick_shape(SHAPES, num_seqs, num_tokens) == expected


def test_pick_shape_takes_an_exact_fit_without_padding():
    assert pick_shape([(2, 16), (4, 16)], 4, 16) == (4, 16)
    assert pick_shape([(2, 16)], 2, 16) == (2, 16)


@pytest.mark.parametrize(
    "num_seqs, num_tokens, shape, expected",
    [
        (1, 19, (2, 32), [13]),
        (3, 3, (8, 8), [1, 1, 1, 1, 1]),
        (2, 10, (8, 16), [1, 1, 1, 1, 1, 1]),
        (1, 2, (4, 16), [1, 1, 12]),
        (4, 16, (4, 16), []),
    ],
)
def test_padding_lens(num_seqs, num_tokens, shape, expected):
    lens = padding_lens(num_seqs, num_tokens, shape)
    assert lens == expected
    assert num_tokens + sum(lens) == shape[1] and num_seqs + len(lens) == shape[0]


def staged_host_step() -> HostStep:
    host = HostStep()  # two sequences, the first with a hole and no sample: 6 + 1 tokens
    visible_start = [0, 0, 0, 0, 4, 4, 4, 4, 4]
    host.add_chunk([7, 8, 9, 10, 11, 12, 13, 14, 15], [5, 2, 6], [(0, 2), (5, 9)], 9, visible_start, False, 4)
    host.add_chunk([3], [9], [(0, 1)], 1, None, True, 4)
    return host


@pytest.mark.parametrize("shape", [(2, 7), (3, 16), (5, 16)], ids=["exact", "one-padding-seq", "three-padding-seqs"])
def test_staged_inputs_hold_the_eager_metadata_then_the_padding_sequences(shape):
    static = StaticInputs(max_seqs=5, max_tokens=16, max_blocks=4, scratch_block=40, block_size=4, device="cpu")
    older = HostStep()  # NOTE: a step before it, over the same buffers: nothing of it may show
    for i in range(5):
        older.add_chunk([60 + i] * 3, [30 + i], [(0, 3)], 3, [2, 2, 2], True, 4)
    static.stage(older, (5, 15))
    inputs = static.stage(staged_host_step(), shape)
    host, (seqs, tokens) = staged_host_step(), shape
    eager = StepMetadata.build(host, torch.device("cpu"))
    assert inputs.is_staged and inputs.input_ids.tolist() == [7, 8, 12, 13, 14, 15, 3]
    assert inputs.logits_indices.tolist() == [6] and static.logits_indices[:seqs].tolist() == [6] + [0] * (seqs - 1)
    for name in ("slot_mapping", "cu_seqlens_q", "positions", "kv_lens", "visible_start"):
        assert getattr(inputs.meta, name).tolist() == getattr(eager, name).tolist(), name
    assert inputs.meta.block_tables[0, :3].tolist() == [5, 2, 6] and inputs.meta.block_tables[1, 0] == 9
    pad_lens = padding_lens(2, 7, shape)
    cu = static.cu_seqlens_q[: seqs + 1].tolist()
    assert cu[2:] == [7 + sum(pad_lens[:i]) for i in range(len(pad_lens) + 1)] and cu[-1] == tokens
    assert static.slot_mapping[7:tokens].tolist() == [160] * (tokens - 7)  # the scratch block's first slot
    assert static.positions[7:tokens].tolist() == [0] * (tokens - 7)
    assert static.visible_start[7:tokens].tolist() == [0] * (tokens - 7)
    assert static.kv_lens[2:seqs].tolist() == [1] * (seqs - 2)
    assert static.block_tables[2:seqs, 0].tolist() == [40] * (seqs - 2)


# -- the graph path through the real engine, on the CPU: each "graph" replays its forward eagerly on the static
#    buffers, so the padding, the buffers and the choice of logits rows are checked against an eager engine --


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_graphs"), vocab_size=64, max_position_embeddings=256)


class EagerReplay:
    """A stand-in for a captured graph: replay runs the bucket's forward on the static buffers."""

    def __init__(self, graphs: StepGraphs, shape):
        self.graphs, self.shape = graphs, shape

    def replay(self):
        for static, fresh in zip(self.graphs.outputs[self.shape], self.graphs._forward(self.shape), strict=True):
            static.copy_(fresh)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "greedy-and-sampled"])
@pytest.mark.parametrize("num_scheduler_steps", [1, 4], ids=["steps", "bursts"])
def test_the_graph_path_gives_the_eager_tokens_for_prefill_mixed_and_decode_steps(
    tiny_dir, monkeypatch, num_scheduler_steps, sampled
):
    """Bursts: a burst's first step is staged on the host, its later ones are advanced in the buffers on the device.
    Sampled requests (seeded, every other one) draw the same tokens as in the eager engine, beside greedy ones."""
    monkeypatch.setattr(StepGraphs, "_capture", lambda self, shape: (EagerReplay(self, shape), self._forward(shape)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    set_padding, paddings = StaticInputs.set_padding, []

    def checked_padding(self, num_seqs, num_tokens, shape):  # the buffers hold padding_lens' layout
        set_padding(self, num_seqs, num_tokens, shape)
        cu = self.cu_seqlens_q[num_seqs : shape[0] + 1].tolist()
        lens = [b - a for a, b in zip(cu, cu[1:], strict=False)]
        assert cu[0] == num_tokens and lens == padding_lens(num_seqs, num_tokens, shape)
        paddings.append(lens)

    monkeypatch.setattr(StaticInputs, "set_padding", checked_padding)
    stage = StaticInputs.stage

    def checked_stage(self, host, shape):  # the staged buffers hold padding_lens' layout
        inputs = stage(self, host, shape)
        num_seqs, num_tokens = len(host.kv_lens), len(host.input_ids)
        cu = self.cu_seqlens_q[num_seqs : shape[0] + 1].tolist()
        lens = [b - a for a, b in zip(cu, cu[1:], strict=False)]
        assert cu[0] == num_tokens and lens == padding_lens(num_seqs, num_tokens, shape)
        paddings.append(lens)
        return inputs

    monkeypatch.setattr(StaticInputs, "stage", checked_stage)
    # NOTE: the op checks its arguments here (the engine passes check=False): the CPU path reads kv_lens only to size
    # its gather, so a burst step that kept the last step's kv_lens gave the same tokens; the contract rejects it.
    op = llama.rope_paged_attention
    monkeypatch.setattr(llama, "rope_paged_attention", lambda *args, check, **hints: op(*args, check=True, **hints))
    kwargs = dict(
        max_model_len=256,
        max_num_seqs=4,
        num_blocks=128,
        block_size=4,
        cpu_decode_mirror=False,
        max_num_batched_tokens=16,
        num_scheduler_steps=num_scheduler_steps,
    )  # chunked prefills: steps where some sequences do not sample
    graphed, eager = mp.LLM(str(tiny_dir), **kwargs), mp.LLM(str(tiny_dir), **kwargs)
    runner = graphed.engine.runner
    runner.graphs = graphed._loop.call(lambda engine: StepGraphs(engine.runner, SHAPES_4))
    replayed, advanced = [], []
    run, advance = runner.graphs.run, runner.graphs.static.advance
    runner.graphs.run = lambda inputs, shape: (replayed.append(shape), run(inputs, shape))[1]
    runner.graphs.static.advance = lambda inputs, sampled: (advanced.append(shape_of(inputs)), advance(inputs, sampled))
    gen = torch.Generator().manual_seed(3)
    bases = [torch.randint(6, 64, (n,), generator=gen).tolist() for n in (9, 14, 21, 30, 7, 17)]
    follow_ups = [b + torch.randint(6, 64, (2 + i,), generator=gen).tolist() for i, b in enumerate(bases)]
    params = [mp.SamplingParams(max_tokens=3 + 4 * i, temperature=0.0, ignore_eos=True) for i in range(6)]
    if sampled:  # NOTE: seeded, so both engines draw alike; top-k on one, so its masking runs on the graph path too
        params[1::2] = [mp.SamplingParams(max_tokens=3 + 4 * i, temperature=0.8, seed=i, top_k=8 * (i == 3),
                                          ignore_eos=True) for i in (1, 3, 5)]  # fmt: skip
    for prompts in (bases, follow_ups):  # 6 requests, 4 at a time: later ones join running decodes
        outs = graphed.generate(prompts, params, use_tqdm=False)
        assert [o.token_ids for o in outs] == [o.token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
        if sampled:  # ... and they did sample: not all of their tokens are the greedy ones
            greedy = [mp.SamplingParams(max_tokens=p.max_tokens, temperature=0.0, ignore_eos=True) for p in params]
            argmax = eager.generate(prompts[1::2], greedy[1::2], use_tqdm=False)
            assert [o.token_ids for o in outs[1::2]] != [o.token_ids for o in argmax]
    assert all(o.num_cached_tokens > 0 for o in outs)
    shapes = set(replayed)
    assert (advanced != []) == (num_scheduler_steps > 1), "only a burst's later steps are advanced on the device"
    assert all(seqs == tokens for seqs, tokens in advanced), "... and they are decode steps"
    assert {(1, 1), (2, 2), (4, 4)} & shapes, "decode buckets"
    assert {s for s in shapes if s[0] < s[1]}, "prefill buckets"
    assert any(s[0] == 5 for s in shapes), "a full batch with a prefill (max_num_seqs + 1)"
    assert any(len(lens) > 1 for lens in paddings), "several padding sequences"
    graphed.engine.kv.check_integrity()


def shape_of(inputs) -> tuple[int, int]:
    return inputs.meta.kv_lens.shape[0], inputs.input_ids.shape[0]


SHAPES_4 = graph_shapes((1, 2, 4), max_num_seqs=4, token_sizes=(8, 16, 32, 64), max_tokens_per_seq=16)
