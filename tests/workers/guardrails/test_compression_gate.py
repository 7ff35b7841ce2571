"""The compression gate on the real model: int8 within its bound, 4-bit measured against it, verdicts round-trip."""
import pytest

from workers.fuser import Fuser
from workers.guardrails.compression_gate import DEFAULT_MAX_KL_INCREASE, CompressionVerdict, measure_compression
from workers.model.runner import ModelRunner


@pytest.fixture(scope="module")
def int8(runner: ModelRunner) -> CompressionVerdict:
    return measure_compression(Fuser(runner), "int8", DEFAULT_MAX_KL_INCREASE["int8"])


def test_int8_adds_less_teacher_forced_kl_than_its_bound(int8: CompressionVerdict) -> None:
    assert int8.passed and int8.first_token_agreement == 1.0
    assert int8.tf_kl_exact > 0  # cacheblend itself is not exact: the increase is measured against it
    assert abs(int8.kl_increase) < DEFAULT_MAX_KL_INCREASE["int8"]


@pytest.mark.slow  # make test's budget: a second measurement
def test_four_bits_cost_more_than_eight(runner: ModelRunner, int8: CompressionVerdict) -> None:
    int4 = measure_compression(Fuser(runner), "int4", DEFAULT_MAX_KL_INCREASE["int4"])
    assert int4.kl_increase > int8.kl_increase
    assert int4.tf_kl_exact == int8.tf_kl_exact  # the same exact reference


def test_a_verdict_survives_its_json(int8: CompressionVerdict) -> None:
    assert CompressionVerdict.from_json(int8.to_json()) == int8
