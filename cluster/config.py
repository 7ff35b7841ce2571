"""The serving configuration: a frozen `ServeConfig` from defaults, a YAML file or a mapping (pydantic at the edge)."""
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from cluster.config_schema import (
    EngineConfig,
    FusionConfig,
    LimitsConfig,
    PromptConfig,
    ServedModelConfig,
    ServerConfig,
    TierConfig,
    WorkerConfig,
    default_tiers,
)
from kvplane.checks import check
from kvplane.tiers.spec import TierSpec
from scheduler.admission import AdmissionConfig
from scheduler.autoscaling import AutoscalingPolicy
from scheduler.weights import RouterWeights
from workers.guardrails.guards import GuardrailsConfig

__all__ = [
    "ConfigError",
    "EngineConfig",
    "FusionConfig",
    "GuardrailsConfig",
    "LimitsConfig",
    "PromptConfig",
    "ServeConfig",
    "ServedModelConfig",
    "ServerConfig",
    "TierConfig",
    "WorkerConfig",
    "config_from_dict",
    "config_to_dict",
    "field_problems",
    "load_config",
]


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Everything `blendserve serve` needs; every field has a default, so no file is needed at all."""

    model: ServedModelConfig = field(default_factory=ServedModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    fusion: FusionConfig = field(default_factory=FusionConfig)
    guardrails: GuardrailsConfig = field(default_factory=GuardrailsConfig)
    data_dir: Path = Path("data")
    tiers: tuple[TierConfig, ...] | None = None
    router: RouterWeights = field(default_factory=RouterWeights)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    autoscaling: AutoscalingPolicy | None = None
    workers: WorkerConfig = field(default_factory=WorkerConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)

    def __post_init__(self) -> None:
        tiers = default_tiers(self.data_dir) if self.tiers is None else tuple(self.tiers)
        object.__setattr__(self, "tiers", tiers)
        check(len(tiers) > 0, "tiers", "a non-empty list (or null for the defaults)", list(tiers))
        weighted = f"a tier of router.tier_weights {sorted(self.router.tier_weights)}"
        names = [tier.name for tier in tiers]
        for i, name in enumerate(names):
            check(name not in names[:i], f"tiers[{i}].name", "unique among the tiers", name)
            check(name in self.router.tier_weights, f"tiers[{i}].name", weighted, name)
        if self.autoscaling is not None:
            low, high = self.autoscaling.min_replicas, self.autoscaling.max_replicas
            replicas = self.workers.num_replicas
            check(low <= replicas <= high, "workers.num_replicas", f"within autoscaling's [{low}, {high}]", replicas)

    @property
    def tier_specs(self) -> list[TierSpec]:
        """The kvplane specs of the configured tiers, in the order listed."""
        return [tier.to_spec() for tier in self.tiers or ()]

    def tier(self, name: str) -> TierConfig | None:
        """The configured tier of that role, if any."""
        return next((tier for tier in self.tiers or () if tier.name == name), None)

    def shared_folder(self, folder: str) -> tuple[str, dict[str, Any]]:
        """URL and storage options of `folder` where every node reads it: in the object tier when configured,
        else under the data folder (a one-node deployment)."""
        shared = self.tier("object")
        if shared is not None:
            return f"{shared.url.rstrip('/')}/{folder}", dict(shared.storage_options)
        return f"file://{self.data_dir.absolute() / folder}", {}


class ConfigError(ValueError):
    """A configuration that cannot be served; one problem per line, each led by its field path."""

    def __init__(self, problems: Sequence[str], source: str = "configuration") -> None:
        self.problems = tuple(problems)
        super().__init__(f"invalid {source}:\n  " + "\n  ".join(self.problems))


class _ConfigDocument(BaseModel):
    """The edge: pydantic builds the frozen sections (unknown keys refused) and runs their checks."""

    model_config = ConfigDict(extra="forbid")
    config: ServeConfig


# Section checks say "<field> must ...": the field moves into the path, the rest is the problem.
_FIELD_FIRST = re.compile(
    r"(?P<field>(?:[A-Za-z_]\w*|\[[^\]]*\])(?:\[[^\]]*\]|\.[A-Za-z_]\w*)*) (?P<problem>must .*)", re.DOTALL
)
_PROBLEMS = {
    "missing": "is required",
    "missing_argument": "is required",
    "extra_forbidden": "is not a known field",
    "unexpected_keyword_argument": "is not a known field",
}


def _join(path: str, part: str | int) -> str:
    """`path` extended by a key, an index or a relative path such as `[2].role`."""
    if isinstance(part, int):
        return f"{path}[{part}]"
    if part.startswith("["):
        return path + part
    return f"{path}.{part}" if path else part


def field_problems(error: ValidationError, skip: int = 0) -> list[tuple[str, str]]:
    """(field path, problem) for each error, e.g. ("fusion.recompute_ratio", "must be in [0, 1], got 1.5")."""
    found: list[tuple[str, str]] = []
    for detail in error.errors(include_url=False):
        path = ""
        for part in detail["loc"][skip:]:
            path = _join(path, part)
        if detail["type"] == "value_error":
            problem = str(detail["ctx"]["error"])
            match = _FIELD_FIRST.fullmatch(problem)
            if match:
                path, problem = _join(path, match["field"]), match["problem"]
        elif detail["type"] == "json_invalid":
            problem = f"is not valid JSON ({detail['ctx']['error']})"
        else:
            message = detail["msg"]
            problem = _PROBLEMS.get(detail["type"], message[:1].lower() + message[1:])
        found.append((path, problem))
    return found


def config_from_dict(data: Mapping[str, Any] | None, source: str = "configuration") -> ServeConfig:
    """The configuration a mapping describes (as Ray Serve hands `build_app` its arguments); None means defaults."""
    # Through JSON in strict mode: `port: true` or `capacity_bytes: "1"` are refused, not coerced.
    document = json.dumps({"config": {} if data is None else data}, default=str)
    try:
        return _ConfigDocument.model_validate_json(document, strict=True).config
    except ValidationError as error:
        problems = [f"{path or '(top level)'}: {problem}" for path, problem in field_problems(error, 1)]
        raise ConfigError(problems, source) from None


def load_config(path: Path | None = None) -> ServeConfig:
    """The configuration in a YAML file, or the embedded defaults when `path` is None."""
    if path is None:
        return ServeConfig()
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as error:
        raise ConfigError([f"cannot read the file: {error.strerror or error}"], str(path)) from error
    except yaml.YAMLError as error:
        raise ConfigError([f"not valid YAML: {error}"], str(path)) from error
    return config_from_dict(data, str(path))


def config_to_dict(config: ServeConfig) -> dict[str, Any]:
    """Plain data (str, numbers, lists, dicts) that `config_from_dict` and YAML take back unchanged."""
    return _plain(config)


def _plain(value: Any) -> Any:
    """Dataclasses and mappings as dicts, sequences as lists, paths as strings."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return str(value) if isinstance(value, Path) else value
