"""bench/store_bench.py writes the documented JSON for every tier, S3 included (its own moto server)."""
import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "store_bench.py"


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT_URL")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)


def test_benchmark_reports_every_tier_and_the_references(tmp_path: Path) -> None:
    out = tmp_path / "store-bench.json"
    done = run(tmp_path, "--tiers", "ram,ssd,s3", "--size-mb", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert json.loads(done.stdout) == result
    assert set(result["tiers"]) == {"ram", "ssd", "s3"}
    for figures in result["tiers"].values():
        assert set(figures) == {"put_gbps", "get_gbps", "layer_get_ms_p50", "layer_get_ms_p99"}
        assert figures["put_gbps"] > 0 and figures["get_gbps"] > 0
        assert 0 < figures["layer_get_ms_p50"] <= figures["layer_get_ms_p99"]
    assert result["reference"]["memcpy_gbps"] > 0 and result["reference"]["file_read_gbps"] > 0


def test_unknown_tiers_are_refused(tmp_path: Path) -> None:
    done = run(tmp_path, "--tiers", "tape", "--size-mb", "1", "--out", str(tmp_path / "x.json"))
    assert done.returncode != 0 and "tiers must come from" in done.stderr
