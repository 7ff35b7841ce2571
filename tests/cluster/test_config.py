"""Serving configuration: embedded defaults, YAML and dict round trips, and errors that name the field path."""
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cluster.config import (
    ConfigError,
    ServeConfig,
    TierConfig,
    config_from_dict,
    config_to_dict,
    load_config,
)
from kvplane.tiers.spec import TierSpec

CUSTOM: dict[str, Any] = {
    "model": {"path": "/models/llama-1b", "dtype": "float16"},
    "fusion": {"mode": "cachecraft", "recompute_ratio": 0.2},
    "data_dir": "/var/lib/blendserve",
    "tiers": [
        {"name": "device", "url": "device://", "capacity_bytes": 2 << 30, "policy": "lru"},
        {"name": "ssd", "url": "file:///mnt/nvme/kv", "capacity_bytes": 100 << 30},
        {
            "name": "object",
            "url": "s3://kvcache/prod",
            "capacity_bytes": 1 << 40,
            "storage_options": {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}},
        },
    ],
    "router": {"tier_weights": {"device": 1.0, "ssd": 0.4, "object": 0.05}, "penalty_bytes_per_queued": 1 << 20},
    "admission": {"max_queued_per_worker": 4},
    "autoscaling": {"min_replicas": 2, "max_replicas": 8, "ttft_slo_s": 0.5},
    "workers": {"num_replicas": 2, "num_cpus": 4, "num_gpus": 1},
    "server": {"host": "0.0.0.0", "port": 9000},
    "limits": {"max_documents": 8, "max_tokens": 64, "default_max_tokens": 16},
}


def write_yaml(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def problems_of(data: object) -> str:
    with pytest.raises(ConfigError) as caught:
        config_from_dict(data)  # type: ignore[arg-type]
    return str(caught.value)


def test_no_file_gives_the_embedded_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(None)
    assert config == ServeConfig() == config_from_dict({}) == config_from_dict(None)
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8000)
    assert config.model.dtype == "auto"  # made concrete by each worker for its own hardware
    assert (config.fusion.mode, config.fusion.recompute_ratio) == ("cacheblend", 0.15)
    assert config.fusion.selection_span_tokens == 16
    assert config.engine.kind == "vllm" and config.model.path is None
    assert config.model.served_name == "SmolLM2-135M-Instruct"
    assert [(t.name, t.url) for t in config.tiers or ()] == [
        ("device", "device://"),
        ("ram", "ram://"),
        ("ssd", f"file://{tmp_path}/data/kv"),
    ]
    assert config.autoscaling is None and config.workers.num_replicas == 1


def test_an_empty_yaml_file_means_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(path) == ServeConfig()


def test_yaml_values_land_in_the_frozen_sections(tmp_path: Path) -> None:
    config = load_config(write_yaml(tmp_path, CUSTOM))
    assert config.model.path == Path("/models/llama-1b") and config.model.served_name == "llama-1b"
    assert config.fusion.mode == "cachecraft" and config.autoscaling is not None
    assert config.autoscaling.max_replicas == 8 and config.admission.max_queued_per_worker == 4
    assert config.router.tier_weight("object") == 0.05 and config.router.tier_weight("ram") == 0.0
    assert config.tier_specs[2] == TierSpec(
        "object", "s3://kvcache/prod", 1 << 40, "tinylfu", {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.fusion.mode = "epic"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.tiers[2].storage_options["x"] = 1  # type: ignore[index]


@pytest.mark.parametrize("data", [{}, CUSTOM], ids=["defaults", "custom"])
def test_yaml_round_trip_is_lossless(tmp_path: Path, data: dict[str, Any]) -> None:
    config = config_from_dict(data)
    dumped = config_to_dict(config)
    again = load_config(write_yaml(tmp_path, dumped))
    assert again == config
    assert config_to_dict(again) == dumped


def test_a_dict_from_ray_serve_builds_the_same_config() -> None:
    assert config_from_dict(CUSTOM) == config_from_dict(yaml.safe_load(yaml.safe_dump(CUSTOM)))


def test_relative_data_dir_places_the_default_ssd_tier_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = config_from_dict({"data_dir": "state"})
    assert config.tier_specs[2] == TierSpec("ssd", f"file://{tmp_path}/state/kv", 16 << 30)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"fusion": {"recompute_ratio": 1.5}}, "fusion.recompute_ratio: must be in [0, 1], got 1.5"),
        ({"fusion": {"selection_span_tokens": 0}}, "fusion.selection_span_tokens: must be an integer >= 1, got 0"),
        ({"fusion": {"mode": "turbo"}}, "fusion.mode: must be one of"),
        ({"fusion": {"ratio": 0.2}}, "fusion.ratio: is not a known field"),
        ({"fusoin": {}}, "fusoin: is not a known field"),
        ({"model": {"dtype": "int8"}}, "model.dtype: must be one of"),
        ({"model": {"name": " "}}, "model.name: must be a non-empty string"),
        ({"engine": {"kind": "tensorrt"}}, "engine.kind: must be one of ('vllm', 'torch')"),
        ({"engine": {"vllm": {"max_model_len": 16}}}, "engine.vllm.max_model_len: must be an int >= 256"),
        ({"engine": {"vllm": {"block_size": 100}}}, "engine.vllm.block_size: must be one of 16, 32, 64, 128"),
        ({"engine": {"chunk_context": "suffix"}}, "engine.chunk_context: must be one of"),
        ({"prompt": {"question_template": "Q: {q}"}}, "prompt.question_template: must be a template whose only field"),
        ({"tiers": []}, "tiers: must be a non-empty list"),
        ({"tiers": [{"name": "ram", "url": "ram://"}]}, "tiers[0].capacity_bytes: is required"),
        ({"tiers": [{"name": "ram", "url": "/tmp/kv", "capacity_bytes": 1}]}, "tiers[0].url: must be a URL"),
        ({"tiers": [{"name": "ram", "url": "ram://", "capacity_bytes": -1}]}, "tiers[0].capacity_bytes: must be"),
        ({"tiers": [{"name": "ram", "url": "ram://", "capacity_bytes": 1, "policy": "fifo"}]}, "tiers[0].policy"),
        (
            {"tiers": [{"name": "nvme", "url": "ram://", "capacity_bytes": 1}]},
            "tiers[0].name: must be one of ['device'",
        ),
        ({"tiers": [{"name": "ram", "url": "file:///kv", "capacity_bytes": 1}]}, "tiers[0].url: must be a ram"),
        ({"server": {"default_tenant": "a b"}}, "server.default_tenant: must be 1 to 64 letters"),
        ({"server": {"api_keys": {"short": "acme"}}}, "server.api_keys: must be keys of at least 8 characters"),
        ({"engine": {"num_threads": 0}}, "engine.num_threads: must be an int >= 1"),
        (
            {"tiers": [{"name": "ram", "url": "ram://", "capacity_bytes": 1}] * 2},
            "tiers[1].name: must be unique among the tiers",
        ),
        ({"router": {"tier_weights": {"ram": -1.0}}}, "router.tier_weights['ram']: must be a finite number >= 0"),
        ({"router": {"penalty_bytes_per_queued": -5}}, "router.penalty_bytes_per_queued: must be"),
        ({"admission": {"max_queued_per_worker": 0}}, "admission.max_queued_per_worker: must be an int >= 1"),
        ({"autoscaling": {"min_replicas": 3, "max_replicas": 2}}, "autoscaling.max_replicas: must be an int >= 3"),
        ({"autoscaling": {"min_replicas": 2}}, "workers.num_replicas: must be within autoscaling's [2, 4], got 1"),
        ({"workers": {"num_replicas": 0}}, "workers.num_replicas: must be an int >= 1"),
        ({"workers": {"num_gpus": -1}}, "workers.num_gpus: must be a finite number >= 0"),
        ({"server": {"port": 70000}}, "server.port: must be an int in [1, 65535]"),
        ({"server": {"port": "8000"}}, "server.port: input should be a valid integer"),
        ({"server": {"port": True}}, "server.port: input should be a valid integer"),
        ({"limits": {"max_tokens": 0}}, "limits.max_tokens: must be an int >= 1"),
        ({"limits": {"max_request_body_bytes": 0}}, "limits.max_request_body_bytes: must be an int >= 1"),
        ({"limits": {"default_max_tokens": 2048}}, "limits.default_max_tokens: must be <= max_tokens (1024)"),
        ([1, 2], "(top level): input should be"),
    ],
)
def test_each_bad_value_is_refused_with_its_field_path(data: object, expected: str) -> None:
    assert expected in problems_of(data)


def test_all_problems_are_reported_at_once() -> None:
    message = problems_of({"fusion": {"recompute_ratio": 2}, "server": {"port": 0}, "extra": 1})
    for path in ("fusion.recompute_ratio:", "server.port:", "extra:"):
        assert path in message


def test_bad_files_are_config_errors_naming_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("fusion: [unclosed\n")
    for path, expected in [(broken, "not valid YAML"), (tmp_path / "absent.yaml", "cannot read the file")]:
        with pytest.raises(ConfigError, match=expected) as caught:
            load_config(path)
        assert str(path) in str(caught.value)


def test_dataclasses_validate_when_built_in_python_too() -> None:
    with pytest.raises(ValueError, match="capacity_bytes"):
        TierConfig("ram", "ram://", -1)
    with pytest.raises(ValueError, match="tiers"):
        ServeConfig(tiers=())


@given(st.floats(allow_nan=False))
def test_a_ratio_is_accepted_exactly_when_it_lies_in_the_unit_interval(ratio: float) -> None:
    data = {"fusion": {"recompute_ratio": ratio}}
    if 0.0 <= ratio <= 1.0:
        assert config_from_dict(data).fusion.recompute_ratio == ratio
    else:
        assert "fusion.recompute_ratio: must be in [0, 1]" in problems_of(data)


def test_the_documented_example_loads(tmp_path: Path) -> None:
    guide = Path(__file__).parents[2] / "docs" / "configuration.md"
    path = tmp_path / "example.yaml"
    path.write_text(guide.read_text().split("```yaml\n", 1)[1].split("```", 1)[0])
    config = load_config(path)
    assert config.model.served_name == "SmolLM2-360M-Instruct" and config.autoscaling is not None
    assert [tier.name for tier in config.tiers or ()] == ["device", "ram", "ssd", "object"]


def test_serve_command_refuses_a_bad_configuration_naming_the_field(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cluster.cli import app

    path = write_yaml(tmp_path, {"server": {"port": 0}})
    result = CliRunner().invoke(app, ["serve", "--config", str(path)])
    assert result.exit_code != 0
    assert "server.port" in result.output


def test_serve_command_refuses_a_bad_dtype(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cluster.cli import app

    result = CliRunner().invoke(app, ["serve", "--dtype", "int8"])
    assert result.exit_code != 0
    assert "model.dtype" in result.output and "int8" in result.output
