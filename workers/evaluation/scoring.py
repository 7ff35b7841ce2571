"""SQuAD-style answer normalisation and token-level F1 (as CacheBlend and the data README use)."""
import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, collapse white space."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, reference: str) -> float:
    """Harmonic mean of token precision and recall after normalisation."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def best_f1(prediction: str, references: list[str]) -> float:
    """F1 against the closest of several reference answers."""
    return max((token_f1(prediction, r) for r in references), default=0.0)


def contains_answer(prediction: str, references: list[str]) -> float:
    """1.0 when some reference answer appears in the prediction after normalisation (RULER's string match)."""
    text = f" {normalize_answer(prediction)} "
    return float(any(f" {normalize_answer(r)} " in text for r in references if normalize_answer(r)))
