"""The prompt composer (prompts.py): exact token layouts on a character tokenizer, then the four recipes on
the real SmolLM2 tokenizer (no model)."""

import pytest

from minipic_lite.config import ControlTokens
from minipic_lite.hashing import root_hash
from minipic_lite.prompts import Module, Param, Piece, PromptComposer
from minipic_lite.spans import SegmentKind, prompt_block_hashes

S, P, PAD = 1, 2, 3
CONTROL = ControlTokens(ssep_id=S, pdep_id=P, pad_id=PAD)


class CharTokenizer:
    """One token per character (its code point); no chat template."""

    chat_template = None

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, token_ids, skip_special_tokens=False):
        return "".join("|" if t in (S, P, PAD) else chr(t) for t in token_ids)


@pytest.fixture
def chars():
    return PromptComposer(CharTokenizer(), CONTROL, block_size=4)


def test_compose_pads_before_each_marker_so_it_starts_a_block(chars):
    prompt = chars.compose(
        [Piece("ab", label="lead"), Piece("xyz", SegmentKind.SSEP, "doc"), Piece("q", SegmentKind.PDEP)]
    )
    a, b, x, y, z, q = (ord(c) for c in "abxyzq")
    assert prompt.token_ids == (a, b, PAD, PAD, S, x, y, z, P, q)
    assert prompt.labels == ("lead", "doc", None)
    assert prompt.text == "ab||" + "|xyz" + "|q" and prompt.block_size == 4 and prompt.control == CONTROL
    assert [(s.kind, s.start, s.end) for s in prompt.segments] == [
        (SegmentKind.LEADING, 0, 4),
        (SegmentKind.SSEP, 4, 8),
        (SegmentKind.PDEP, 8, 10),
    ]
    assert prompt.visible_start == (0,) * 4 + (4,) * 4 + (0, 0) and prompt.has_markers


def test_a_piece_without_a_marker_continues_its_segment_and_pad_end_fills_the_last_block(chars):
    prompt = chars.compose([Piece("x", SegmentKind.SSEP, "doc"), Piece((50, 51))], pad_end=True)
    assert prompt.token_ids == (S, ord("x"), 50, 51) and prompt.labels == ("doc",)
    assert chars.compose([Piece("abcde")], pad_end=True).token_ids == (*map(ord, "abcde"), PAD, PAD, PAD)
    assert not chars.compose([Piece("abc")]).has_markers


def test_recipes_frame_the_pieces_without_a_chat_template(chars):
    # no chat template: the system text and a newline lead, nothing trails the question
    ba = chars.block_attention("sys", ["d1", "d2"], "q?")
    assert ba.text == "sys\n" + "|d1\n\n|||" + "|d2\n\n|||" + "|q?"
    assert ba.labels == ("system", "doc 0", "doc 1", "question") and ba.recipe == "block_attention"
    assert chars.prefix("sys", ["d1", "d2"], "q?").text == "sys\nd1\n\nd2\n\nq?"
    # epic: the first B-1 = 3 tokens of each document in a PDEP link block, the rest an SSEP span
    epic = chars.epic(None, ["abcdef"], "q")
    assert epic.text == "|abc" + "|def\n\n||" + "|q" and epic.labels == ("link 0", "doc 0", "question")
    assert chars.recipe("epic", None, ["abcdef"], "q") == epic


def test_span_prompts_are_the_padded_reusable_spans_alone(chars):
    assert [p.text for p in chars.span_prompts("block_attention", ["d1", "abcdef"])] == ["|d1\n\n|||", "|abcdef\n\n|||"]
    assert [p.text for p in chars.span_prompts("epic", ["a", "abcdef"])] == ["|def\n\n||"]  # "a\n\n" is all link
    schema = [Module("m", "rules"), Param("p")]
    assert [(p.text, p.labels) for p in chars.span_prompts("prompt_cache", schema)] == [("|m||", ("rules",))]
    with pytest.raises(ValueError, match="recipe 'prefix' has no position-independent spans"):
        chars.span_prompts("prefix", ["d"])


def test_bad_pieces_and_schemas_are_named(chars):
    with pytest.raises(ValueError, match="the composed prompt is empty"):
        chars.compose([Piece("")])
    with pytest.raises(TypeError, match="schema item 1 must be a Module or a Param, got str"):
        chars.prompt_cache(None, [Module("m"), "oops"], "q")
    no_pad = PromptComposer(CharTokenizer(), ControlTokens(ssep_id=S, pdep_id=P), 4)
    with pytest.raises(ValueError, match="no SSEP control token"):
        no_pad.block_attention(None, ["d"], "q")
    with pytest.raises(ValueError, match="padding needs a pad_id"):
        no_pad.compose([Piece("abcde")], pad_end=True)


@pytest.fixture(scope="module")
def composer():
    from minipic_lite.llm import default_control_tokens
    from minipic_lite.models.loader import load_tokenizer, resolve_model_dir

    tokenizer = load_tokenizer(resolve_model_dir(None))
    return PromptComposer(tokenizer, default_control_tokens(tokenizer), 16)


DOCS = ["The cat sat on the mat. " * 5, "Paris is the capital of France.", "Water boils at 100 degrees. " * 3]


def test_smollm2_control_tokens_are_its_unused_repository_tokens(composer):
    assert composer.control == ControlTokens(ssep_id=3, pdep_id=4, pad_id=5)
    assert composer.tokenizer.convert_ids_to_tokens([3, 4, 5]) == ["<repo_name>", "<reponame>", "<file_sep>"]


def test_block_attention_prompt_layout(composer):
    prompt = composer.block_attention("Answer briefly.", DOCS, "Where is Paris?")
    layout = prompt.layout
    assert [s.kind.value for s in layout.segments] == ["leading", "ssep", "ssep", "ssep", "pdep"]
    assert prompt.labels == ("system", "doc 0", "doc 1", "doc 2", "question")
    assert prompt.text.startswith("<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\n")
    assert prompt.text.endswith("Where is Paris?<|im_end|>\n<|im_start|>assistant\n")
    for seg, doc in zip(layout.segments[1:4], DOCS, strict=True):
        body = prompt.token_ids[seg.start + 1 : seg.end]
        doc_ids = composer.encode(doc + "\n\n")
        assert body[: len(doc_ids)] == doc_ids and set(body[len(doc_ids) :]) <= {5}  # the doc, then padding
    # the prefix recipe is the same tokens without markers and padding
    plain = composer.prefix("Answer briefly.", DOCS, "Where is Paris?")
    assert [t for t in prompt.token_ids if t not in (3, 4, 5)] == list(plain.token_ids)
    assert not plain.has_markers and plain.layout.visible_start == (0,) * len(plain)


def test_epic_links_are_one_pdep_block_before_each_ssep_rest(composer):
    prompt = composer.epic(None, DOCS, "Where is Paris?")
    kinds = [(s.kind.value, s.end - s.start) for s in prompt.segments]
    assert kinds[0][0] == "leading" and kinds[-1][0] == "pdep"
    links = [s for s, label in zip(prompt.segments, prompt.labels, strict=True) if label.startswith("link")]
    assert len(links) == 3 and all(s.kind is SegmentKind.PDEP for s in links)
    assert [s.end - s.start for s in links[:1]] == [16]  # marker + the document's first 15 tokens


def test_span_prompts_hash_as_in_the_final_prompts(composer):
    root = root_hash("composer")
    for recipe in ("block_attention", "epic"):
        final = composer.recipe(recipe, "System A", DOCS[::-1], "Q?")
        final_hashes = set(prompt_block_hashes(final.token_ids, composer.control, 16, root))
        for warm in composer.span_prompts(recipe, DOCS):
            assert len(warm) % 16 == 0 and warm.token_ids[0] == 3
            assert set(prompt_block_hashes(warm.token_ids, composer.control, 16, root)) <= final_hashes


def test_prompt_cache_puts_modules_and_params_in_schema_order(composer):
    schema = [Module(DOCS[0], "rules"), Param("Name: Alice"), Module(DOCS[1]), Param("Age: 7", "age")]
    prompt = composer.prompt_cache("sys", schema, "Hi?")
    assert [s.kind.value for s in prompt.segments] == ["leading", "ssep", "pdep", "ssep", "pdep", "pdep"]
    assert prompt.labels == ("system", "rules", "param 1", "module 2", "age", "question")
    assert [p.labels for p in composer.span_prompts("prompt_cache", schema)] == [("rules",), ("module 2",)]


def test_composer_refuses_markers_in_content_and_missing_control_tokens(composer):
    with pytest.raises(ValueError, match=r"piece 1 \(doc\) contains the SSEP control token at offset 2"):
        composer.compose([Piece("hi"), Piece((7, 8, 3), label="doc")])
    bare = PromptComposer(composer.tokenizer, ControlTokens(), 16)
    with pytest.raises(ValueError, match="no SSEP control token"):
        bare.block_attention(None, DOCS, "Q?")
    with pytest.raises(ValueError, match="unknown recipe"):
        composer.recipe("rag", None, DOCS, "Q?")
