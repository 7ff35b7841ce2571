"""The sections of the serving configuration: frozen dataclasses, each validated on construction."""
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import fsspec

from kvplane.checks import check, check_count, check_non_negative, check_positive
from kvplane.compression.registry import COMPRESSIONS, NONE
from kvplane.eviction.policy import POLICIES
from kvplane.tiers.fs import DEFAULT_TIMEOUT_S
from kvplane.tiers.spec import TierSpec
from workers.chunks.sources import CHUNK_CONTEXTS, DEFAULT_CHUNK_CONTEXT
from workers.fusion.registry import FUSION_MODES
from workers.generation.conversation import CHUNK_CONTEXTS_WITH_SYSTEM, DOCUMENT_PLACES
from workers.generation.prompt import DEFAULT_INSTRUCTION, DEFAULT_QUESTION_TEMPLATE, PromptTemplate
from workers.model.default import DEFAULT_MODEL_NAME
from workers.model.dtype import AUTO, DTYPE_CHOICES
from workers.vllm.settings import VLLMSettings

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

GiB = 1 << 30
MiB = 1 << 20
ENGINES = ("vllm", "torch")
FUSION_PLANS = ("auto", "blend")
BUILTIN_TIER_SCHEMES = ("ram", "device")
TIER_ROLES: Mapping[str, str] = MappingProxyType(
    {
        "device": "each worker's own memory (GPU HBM, or host RAM on a CPU worker)",
        "ram": "the node's KVShard, in RAM",
        "ssd": "the node's KVShard, on local disk (one folder per node under the URL)",
        "object": "an object store shared by the cluster (s3://, gs://, file:// on shared storage, ...)",
    }
)
_TIER_SCHEMES = {"device": ("device",), "ram": ("ram",)}
_TENANT_CHARS = frozenset(string.ascii_letters + string.digits + "-_.")


@dataclass(frozen=True, slots=True)
class ServedModelConfig:
    """Which checkpoint to serve and under which name; no path means the default SmolLM2-135M-Instruct."""

    path: Path | None = None
    name: str | None = None
    dtype: str = AUTO

    def __post_init__(self) -> None:
        check(self.name is None or bool(self.name.strip()), "name", "a non-empty string or null", self.name)
        check(self.dtype in DTYPE_CHOICES, "dtype", f"one of {DTYPE_CHOICES}", self.dtype)

    @property
    def served_name(self) -> str:
        """The model id clients send: `name`, else the checkpoint folder's name, else the default model's."""
        if self.name is not None:
            return self.name
        return self.path.name if self.path is not None else DEFAULT_MODEL_NAME


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine behind each worker (vLLM, or the reference torch engine) and what chunk KV is computed after."""

    kind: str = "vllm"
    chunk_context: str = DEFAULT_CHUNK_CONTEXT
    num_threads: int | None = None  # torch threads per worker (torch engine); None: every core of the machine
    vllm: VLLMSettings = field(default_factory=VLLMSettings)  # used when kind is "vllm"

    def __post_init__(self) -> None:
        check(self.kind in ENGINES, "kind", f"one of {ENGINES}", self.kind)
        check(self.num_threads is None or self.num_threads >= 1, "num_threads", "an int >= 1 or null", self.num_threads)
        check(self.chunk_context in CHUNK_CONTEXTS, "chunk_context", f"one of {CHUNK_CONTEXTS}", self.chunk_context)


@dataclass(frozen=True, slots=True)
class PromptConfig:
    """The RAG prompt: instruction, the documents in order, then the question through `question_template`."""

    instruction: str = DEFAULT_INSTRUCTION
    question_template: str = DEFAULT_QUESTION_TEMPLATE
    use_chat_template: bool = True
    # Where a chat's documents go: "last" (in the last user message, after the earlier turns: answers agree with
    # full prefill as a single question's do) or "start" (after the system message, before the earlier turns: a
    # later turn finds its context in vLLM's prefix cache, but agrees less; docs/serving.md has the figures).
    documents_at: str = "last"
    # What chunk KV is computed after: "default_prefix" (the template's own, so chunks are reused under every
    # system prompt; the fusion recomputes what the difference touches) or "request_prefix" (exact, per prompt).
    chunks_after: str = "default_prefix"

    def __post_init__(self) -> None:
        names = {name for _, name, _, _ in string.Formatter().parse(self.question_template) if name is not None}
        check(names == {"question"}, "question_template", "a template whose only field is {question}", names)
        places = list(DOCUMENT_PLACES)
        check(self.documents_at in DOCUMENT_PLACES, "documents_at", f"one of {places}", self.documents_at)
        check(self.chunks_after in CHUNK_CONTEXTS_WITH_SYSTEM, "chunks_after",
              f"one of {list(CHUNK_CONTEXTS_WITH_SYSTEM)}", self.chunks_after)

    def template(self, tokenizer: "PreTrainedTokenizerBase") -> PromptTemplate:
        """This prompt over a model's tokenizer."""
        return PromptTemplate(
            tokenizer, self.instruction, self.question_template, self.use_chat_template, self.chunks_after
        )


@dataclass(frozen=True, slots=True)
class FusionConfig:
    """Defaults for requests that do not say how to blend: fusion mode and recompute ratio."""

    mode: str = "cacheblend"
    recompute_ratio: float = 0.15
    selection_span_tokens: int = 16  # cacheblend recomputes aligned spans of this many tokens (1: single tokens)
    # "auto": each request in the default mode and ratio blends or is prefilled plainly, whichever the worker
    # predicts reaches the first token sooner (curves measured at its start); "blend": always as asked.
    plan: str = "auto"

    def __post_init__(self) -> None:
        check(self.mode in FUSION_MODES, "mode", f"one of {sorted(FUSION_MODES)}", self.mode)
        check(self.plan in FUSION_PLANS, "plan", f"one of {list(FUSION_PLANS)}", self.plan)
        check(0.0 <= self.recompute_ratio <= 1.0, "recompute_ratio", "in [0, 1]", self.recompute_ratio)
        check(self.selection_span_tokens >= 1, "selection_span_tokens", "an integer >= 1", self.selection_span_tokens)


@dataclass(frozen=True, slots=True)
class TierConfig:
    """One chunk-KV tier: its name (a tier the router weighs), fsspec URL, byte capacity and eviction policy."""

    name: str
    url: str
    capacity_bytes: int
    policy: str = "tinylfu"
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S  # per call to a remote backend (connect, each read); then it is skipped
    compression: str = NONE  # how chunk KV written here is stored (docs/store.md "Compression")

    def __post_init__(self) -> None:
        check(self.name in TIER_ROLES, "name", f"one of {list(TIER_ROLES)} (the tier's role)", self.name)
        scheme = self.url.split("://", 1)[0] if "://" in self.url else ""
        known = scheme in BUILTIN_TIER_SCHEMES or scheme in fsspec.available_protocols()
        check(known, "url", "a URL with a known scheme (ram://, device://, file://, s3://, ...)", self.url)
        allowed = _TIER_SCHEMES.get(self.name, tuple(p for p in fsspec.available_protocols() if p != "memory"))
        check(
            scheme in allowed, "url", f"a {' or '.join(sorted(allowed)[:4])}... URL for the {self.name} tier", self.url
        )
        check_count("capacity_bytes", self.capacity_bytes, 0)
        check(self.policy in POLICIES, "policy", f"one of {sorted(POLICIES)}", self.policy)
        check_positive("timeout_s", self.timeout_s)
        check(self.compression in COMPRESSIONS, "compression", f"one of {sorted(COMPRESSIONS)}", self.compression)
        object.__setattr__(self, "storage_options", MappingProxyType(dict(self.storage_options)))

    def to_spec(self) -> TierSpec:
        """The kvplane spec that opens this tier."""
        options = dict(self.storage_options)
        return TierSpec(
            self.name, self.url, self.capacity_bytes, self.policy, options, self.timeout_s, self.compression
        )


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Worker replicas (a fixed count, or the initial count under autoscaling) and each one's Ray resources."""

    num_replicas: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def __post_init__(self) -> None:
        check_count("num_replicas", self.num_replicas, 1)
        check_non_negative("num_cpus", self.num_cpus)
        check_non_negative("num_gpus", self.num_gpus)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Where the HTTP API listens, who may call it (API keys) and how much one tenant may hold."""

    host: str = "127.0.0.1"
    port: int = 8000
    default_tenant: str = "default"
    # API key -> tenant, inline (for local use: the configuration reaches every replica). Deployments name an
    # environment variable or a secret file holding the same mapping (YAML or JSON) instead.
    api_keys: Mapping[str, str] = field(default_factory=dict)
    api_keys_env: str | None = None
    api_keys_file: str | None = None
    # Without any key the API is open; that is refused on a non-loopback host unless this says so.
    allow_unauthenticated: bool = False
    # Open mode only: take the tenant from X-Tenant (a trusted proxy in front sets it); else X-Tenant is refused.
    trust_tenant_header: bool = False
    metrics_require_key: bool = True  # with keys, GET /metrics needs one too
    max_ongoing_requests: int = 256  # at the ingress; admission and the tenant quota bound the real work
    body_timeout_s: float = 30.0  # a request body slower than this gets 408 and frees its slot
    drain_timeout_s: float = 60.0  # on SIGTERM: how long requests in flight may take to finish
    max_requests_in_flight_per_tenant: int = 32
    # Share of each cache tier one tenant may fill while other tenants hold entries there (1.0: no bound).
    tenant_cache_share: float = 0.5

    def __post_init__(self) -> None:
        check(bool(self.host), "host", "a non-empty string", self.host)
        check(isinstance(self.port, int) and 1 <= self.port <= 65535, "port", "an int in [1, 65535]", self.port)
        check(is_tenant_name(self.default_tenant), "default_tenant", TENANT_RULE, self.default_tenant)
        check_api_keys(self.api_keys, "api_keys")
        object.__setattr__(self, "api_keys", MappingProxyType(dict(self.api_keys)))
        for name in ("api_keys_env", "api_keys_file"):
            value = getattr(self, name)
            check(value is None or bool(value.strip()), name, "a non-empty string or null", value)
        check_count("max_ongoing_requests", self.max_ongoing_requests, 1)
        check_positive("body_timeout_s", self.body_timeout_s)
        check_positive("drain_timeout_s", self.drain_timeout_s)
        check_count("max_requests_in_flight_per_tenant", self.max_requests_in_flight_per_tenant, 1)
        check(0.0 < self.tenant_cache_share <= 1.0, "tenant_cache_share", "in (0, 1]", self.tenant_cache_share)


MIN_API_KEY_CHARS = 8


def check_api_keys(keys: Mapping[str, str], field_name: str) -> None:
    """Keys of at least MIN_API_KEY_CHARS characters, each naming a valid tenant (keys never echoed whole)."""
    for key, tenant in keys.items():
        shown = f"{str(key)[:2]}..."
        check(
            isinstance(key, str) and len(key) >= MIN_API_KEY_CHARS,
            field_name,
            f"keys of at least {MIN_API_KEY_CHARS} characters",
            shown,
        )
        check(isinstance(tenant, str) and is_tenant_name(tenant), f"{field_name}[{shown}]", TENANT_RULE, tenant)


TENANT_RULE = "1 to 64 letters, digits, '-', '_' or '.'"


def is_tenant_name(name: str) -> bool:
    """Whether `name` can name a tenant (it becomes part of chunk keys and metric labels)."""
    return 1 <= len(name) <= 64 and set(name) <= _TENANT_CHARS


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """Bounds on one request; past them the API answers 4xx naming the field."""

    max_documents: int = 64
    max_upload_documents: int = 256
    max_request_body_bytes: int = 4 * MiB
    max_tokens: int = 1024
    default_max_tokens: int = 256
    max_stop_chars: int = 256  # per stop string: each generated token is checked against them

    def __post_init__(self) -> None:
        check_count("max_documents", self.max_documents, 0)
        check_count("max_stop_chars", self.max_stop_chars, 1)
        check_count("max_upload_documents", self.max_upload_documents, 1)
        check_count("max_request_body_bytes", self.max_request_body_bytes, 1)
        check_count("max_tokens", self.max_tokens, 1)
        check_count("default_max_tokens", self.default_max_tokens, 1)
        check(
            self.default_max_tokens <= self.max_tokens,
            "default_max_tokens",
            f"<= max_tokens ({self.max_tokens})",
            self.default_max_tokens,
        )


def default_tiers(data_dir: Path) -> tuple[TierConfig, ...]:
    """The worker's own memory, the node's RAM, then local SSD under `data_dir/kv` (absolute)."""
    return (
        TierConfig("device", "device://", 512 * MiB),
        TierConfig("ram", "ram://", 1 * GiB),
        TierConfig("ssd", f"file://{data_dir.absolute() / 'kv'}", 16 * GiB),
    )
