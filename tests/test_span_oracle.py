"""The test oracle of span semantics (tests/span_oracle.py) on the worked examples of DESIGN §2 and spans.py."""

from tests import span_oracle

S, P, PAD = 1, 2, 3


def test_visibility_of_the_design_example():
    # block_size 4:  s s s _ | S a a a | a _ _ _ | S b b _ | P q q
    tokens = [9, 9, 9, PAD, S, 7, 7, 7, 7, PAD, PAD, PAD, S, 8, 8, PAD, P, 6, 6]
    assert span_oracle.visible_starts(tokens, S, P) == [0] * 4 + [4] * 8 + [12] * 4 + [0] * 3
    assert span_oracle.segment_kinds(tokens, S, P) == ["leading", "ssep", "ssep", "pdep"]
    assert span_oracle.segment_kinds([S, 7, P, 6], S, P) == ["ssep", "pdep"]


def test_hits_follow_what_each_block_sees():
    doc = [S, 7, 7, 7, 7, 7, 7, PAD]  # two blocks of 4
    warm = doc
    prompt = [9, 9, 9, PAD, *doc, P, 6, 6, 6, 6]  # doc at offset 4, then a PDEP question of two blocks
    assert span_oracle.predicted_hits(prompt, [warm], 4, S, P) == [False, True, True, False, False]
    # the PDEP block sees the whole prompt: only a prompt with the same prefix shares it; the last one never hits
    assert span_oracle.predicted_hits(prompt, [prompt], 4, S, P) == [True, True, True, True, False]
    other = [9, 9, 5, PAD, *doc, P, 6, 6, 6, 6]
    assert span_oracle.predicted_hits(prompt, [other], 4, S, P) == [False, True, True, False, False]
    assert span_oracle.predicted_hits(doc[:3] + [7], [doc], 4, S, P) == [False]  # the last token's block
