"""Chunk rules, ids and splitting (pure); the real tokenizer splits a passage into pieces that fit."""
import pytest

from cluster.ingest.chunking import ChunkRule, id_problem, piece_id, split_text
from workers.model.checkpoint import load_model_card
from workers.model.default import prepare_default_model


def test_rules_parse_and_print() -> None:
    assert ChunkRule.parse("row") == ChunkRule()
    assert ChunkRule.parse("tokens:128").max_tokens == 128
    assert str(ChunkRule(64)) == "tokens:64" and str(ChunkRule()) == "row"
    for bad in ("tokens:0", "tokens:", "words:5", ""):
        with pytest.raises(ValueError, match="'row' or 'tokens:N'"):
            ChunkRule.parse(bad)


def test_ids_are_url_safe() -> None:
    assert id_problem("doc-17") is None and id_problem("Q42_a.b~c") is None
    for bad in ("", "-lead", "a b", "a/b", "é", ".", "x" * 129):
        assert "URL-safe" in (id_problem(bad) or "")
    assert piece_id("doc-17", 0) == "doc-17.0" and id_problem(piece_id("doc-17", 3)) is None


def test_split_cuts_at_token_starts_and_joins_back() -> None:
    text = "aa bb cc dd ee"
    starts = lambda t: [i for i, c in enumerate(t) if c != " " and (i == 0 or t[i - 1] == " ")]  # noqa: E731
    count = lambda t: len(t.split())  # noqa: E731
    assert split_text(text, 2, starts, count) == ["aa bb ", "cc dd ", "ee"]
    assert split_text(text, 10, starts, count) == [text]
    assert split_text("", 3, starts, count) == []


def test_a_piece_that_tokenizes_longer_alone_ends_a_token_earlier() -> None:
    text = "ab cd ef"

    def count(piece: str) -> int:
        return len(piece.split()) + (1 if piece.startswith("ab cd") else 0)  # "ab cd" alone takes 3 tokens

    assert split_text(text, 2, lambda _: [0, 3, 6], count) == ["ab ", "cd ef"]


def test_the_real_tokenizer_splits_a_passage_into_pieces_within_the_budget() -> None:
    _, tokenizer = load_model_card(prepare_default_model())
    text = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
            "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.") * 3

    def starts(t: str) -> list[int]:
        return [s for s, _ in tokenizer(t, add_special_tokens=False, return_offsets_mapping=True).offset_mapping]

    def count(t: str) -> int:
        return len(tokenizer(t, add_special_tokens=False).input_ids)

    pieces = split_text(text, 32, starts, count)
    assert "".join(pieces) == text
    assert all(count(p) <= 32 for p in pieces) and len(pieces) >= count(text) // 32
