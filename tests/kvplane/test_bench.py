"""The store benchmark produces the documented JSON for every tier, S3 included (its own moto server)."""
import json
from pathlib import Path

import pytest

from kvplane.bench import run_store_benchmark


def test_benchmark_reports_every_tier_and_the_references(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    out = tmp_path / "store-bench.json"
    result = run_store_benchmark(["ram", "ssd", "s3"], 1, out)
    assert json.loads(out.read_text()) == result
    assert set(result["tiers"]) == {"ram", "ssd", "s3"}
    for figures in result["tiers"].values():
        assert set(figures) == {"put_gbps", "get_gbps", "layer_get_ms_p50", "layer_get_ms_p99"}
        assert figures["put_gbps"] > 0 and figures["get_gbps"] > 0
        assert 0 < figures["layer_get_ms_p50"] <= figures["layer_get_ms_p99"]
    assert result["reference"]["memcpy_gbps"] > 0 and result["reference"]["file_read_gbps"] > 0


def test_unknown_tiers_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tiers"):
        run_store_benchmark(["tape"], 1, tmp_path / "x.json")
