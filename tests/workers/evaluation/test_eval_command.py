"""`blendserve eval` end to end on the real model and real data: the JSON has exactly the documented shape."""
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cluster.cli import app
from tests.workers.conftest import DATA_DIR
from workers.model.default import prepare_default_model
from workers.model.dtype import measured_on, resolve_dtype

QUALITY = ("f1", "accuracy", "agreement_f1", "exact_match", "first_token_agreement", "first_token_kl", "tf_kl",
           "tf_nll_gap")
SUMMARY_KEYS = {"mode", "ratio", "records", "ttft_s_median", "ttft_s_mean", "context_tokens_mean",
                "recomputed_fraction", *QUALITY, *(f"{m}_ci95" for m in QUALITY)}


def test_eval_writes_the_documented_json(tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    data = tmp_path / "one.jsonl"  # the first real HotpotQA record with its first three passages (~400 tokens)
    with open(DATA_DIR / "hotpotqa_hipporag.dev.jsonl") as handle:
        record = json.loads(next(handle))
    data.write_text(json.dumps({**record, "ctxs": record["ctxs"][:3]}) + "\n")
    result = CliRunner().invoke(app, ["eval", "--data", str(data), "--limit", "1", "--modes", "full_reuse,cacheblend",
                                      "--max-new-tokens", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert set(document) == {"model", "engine", "dtype", "hardware", "data", "records", "modes"}
    assert document["records"] == 1 and document["model"] == "SmolLM2-135M-Instruct"
    assert document == {**document, **measured_on(resolve_dtype("auto", prepare_default_model(), on_gpu=False))}
    assert set(document["modes"]) == {"full_prefill", "full_reuse", "cacheblend"}
    for mode, row in document["modes"].items():
        assert set(row) == SUMMARY_KEYS
        assert row["context_tokens_mean"] > 100
        assert row["ttft_s_median"] > 0
        for metric in QUALITY:
            low, high = row[f"{metric}_ci95"]
            assert low <= row[metric] <= high
    full = document["modes"]["full_prefill"]
    assert full["agreement_f1"] == 1.0 and full["first_token_kl"] == 0.0 and full["recomputed_fraction"] == 1.0
    assert full["tf_kl"] == 0.0 and full["exact_match"] == 1.0
    assert document["modes"]["full_reuse"]["tf_kl"] > 0.0  # full reuse does deviate along the answer
    assert 0.0 < document["modes"]["cacheblend"]["recomputed_fraction"] < 0.5
    assert document["modes"]["full_reuse"]["recomputed_fraction"] == 0.0
    assert "cacheblend" in result.output


def test_eval_refuses_an_unknown_mode_and_dtype(tmp_path: Path) -> None:
    data = DATA_DIR / "hotpotqa_hipporag.dev.jsonl"
    for option, value in (("--modes", "nonsense"), ("--dtype", "int8")):
        result = CliRunner().invoke(app, ["eval", "--data", str(data), "--limit", "1", option, value,
                                          "--out", str(tmp_path / "x.json")])
        assert result.exit_code != 0
        assert value in result.output


@pytest.mark.slow  # the default run keeps make test within 15 minutes
def test_eval_gradual_filtering_recomputes_twice_the_ratio_at_the_check_layer(tmp_path: Path) -> None:
    data = DATA_DIR / "hotpotqa_hipporag.dev.jsonl"
    fractions = {}
    for flag in ("--no-gradual-filtering", "--gradual-filtering"):
        out = tmp_path / f"{flag}.json"
        result = CliRunner().invoke(
            app,
            [
                "eval",
                "--data",
                str(data),
                "--limit",
                "1",
                "--modes",
                "cacheblend",
                "--selection-span-tokens",
                "1",
                flag,
                "--max-new-tokens",
                "1",
                "--no-teacher-forced",
                "--out",
                str(out),
            ],
        )
        assert result.exit_code == 0, result.output
        fractions[flag] = json.loads(out.read_text())["modes"]["cacheblend"]["recomputed_fraction"]
    # one extra layer (layer 2's K/V) at 2r instead of r: r / num_layers = 0.15 / 30 more of the context
    assert fractions["--gradual-filtering"] - fractions["--no-gradual-filtering"] == pytest.approx(0.005, abs=5e-4)
