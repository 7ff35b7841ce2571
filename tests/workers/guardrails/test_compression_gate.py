"""The compression gate on the real model: int8 within its bound, 4-bit measured against it, verdicts round-trip."""
import pytest

from workers.fuser import Fuser
from workers.guardrails.compression_gate import DEFAULT_MAX_KL_INCREASE, CompressionVerdict, measure_compression
from workers.model.runner import ModelRunner


@pytest.fixture(scope="module")
def verdicts(runner: ModelRunner) -> dict[str, CompressionVerdict]:
    fuser = Fuser(runner)
    return {name: measure_compression(fuser, name, DEFAULT_MAX_KL_INCREASE[name]) for name in ("int8", "int4")}


def test_int8_adds_less_teacher_forced_kl_than_its_bound(verdicts: dict[str, CompressionVerdict]) -> None:
    int8 = verdicts["int8"]
    assert int8.passed and int8.first_token_agreement == 1.0
    assert int8.tf_kl_exact > 0  # cacheblend itself is not exact: the increase is measured against it
    assert abs(int8.kl_increase) < DEFAULT_MAX_KL_INCREASE["int8"]


def test_four_bits_cost_more_than_eight(verdicts: dict[str, CompressionVerdict]) -> None:
    assert verdicts["int4"].kl_increase > verdicts["int8"].kl_increase
    assert verdicts["int4"].tf_kl_exact == verdicts["int8"].tf_kl_exact  # the same exact reference


def test_a_verdict_survives_its_json(verdicts: dict[str, CompressionVerdict]) -> None:
    verdict = verdicts["int4"]
    assert CompressionVerdict.from_json(verdict.to_json()) == verdict
