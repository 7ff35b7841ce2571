"""SQuAD-style normalisation and F1."""
import pytest

from workers.evaluation.scoring import best_f1, normalize_answer, token_f1


def test_normalisation_drops_case_punctuation_and_articles() -> None:
    assert normalize_answer("The  Exeter College, Oxford!") == "exeter college oxford"


@pytest.mark.parametrize(
    "prediction,reference,expected",
    [("Exeter College", "exeter college", 1.0), ("at Exeter College Oxford", "Exeter College", 2 / 3),
     ("Oxford", "Exeter College", 0.0), ("", "", 1.0), ("the", "Exeter", 0.0)],
)
def test_token_f1(prediction: str, reference: str, expected: float) -> None:
    assert token_f1(prediction, reference) == pytest.approx(expected)


def test_best_f1_takes_the_closest_reference() -> None:
    assert best_f1("Charles County", ["Maryland", "Charles County"]) == 1.0
    assert best_f1("anything", []) == 0.0
