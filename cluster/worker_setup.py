"""Bring up one serving worker inside a Ray replica: its store over the node shard, engine, and heartbeat."""
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import ray
import torch
from ray.actor import ActorHandle

from cluster.compression_verdicts import record_missing_verdicts, verdict_book
from cluster.config import ServeConfig
from kvplane.compression.registry import NONE
from kvplane.compression.verdicts import VerdictGate
from kvplane.ray.health import tier_events
from kvplane.ray.index_reporter import IndexReporter
from kvplane.ray.index_watch import IndexWatch
from kvplane.ray.location_index import launch_location_index
from kvplane.ray.shard import ShardConfig, ensure_local_shard
from kvplane.ray.shard_directory import ShardDirectory
from kvplane.ray.worker_store import open_worker_tiered_store
from kvplane.store import TieredStore
from scheduler.membership import WorkerReport, launch_membership
from workers.chunks.kvplane_store import KVPlaneChunkStore
from workers.engines.base import Engine
from workers.engines.calibration import calibrate_planner
from workers.engines.torch_engine import TorchEngine
from workers.fuser import Fuser
from workers.fusion.base import FallbackOptions, FusionOptions
from workers.guardrails.guards import guarded_fuser
from workers.guardrails.shadow import ShadowSampler, ShadowSummary
from workers.loading.planner import RequestPlanner
from workers.model.checkpoint import load_checkpoint
from workers.model.default import prepare_default_model
from workers.model.dtype import AUTO, Hardware, resolve_dtype, torch_dtype
from workers.model.runner import ModelRunner
from workers.worker import Worker

HEARTBEAT_INTERVAL_S = 1.0
DEVICE_ONLY = frozenset({"device"})  # a worker reports its own memory's placements; shards report theirs
SHARD_REFRESH_EVERY = 10  # heartbeats between re-reading which node shards exist

_log = logging.getLogger(__name__)


def open_serving_tiered_store(
    config: ServeConfig, worker_id: str, node_id: str
) -> tuple[TieredStore, ShardDirectory | None]:
    """The worker's device tier, then its node's KVShard (ram, ssd) and the shared object tier, as configured."""
    index = launch_location_index()
    device, shared = config.tier("device"), config.tier("object")
    directory = open_node_shards(config, index)
    # Sent at once: the router should see a chunk in this worker before the answer reaches the client.
    reporter = IndexReporter(index, worker_id, tiers=DEVICE_ONLY, interval_s=0.0)
    tiered = open_worker_tiered_store(
        device_capacity_bytes=0 if device is None else device.capacity_bytes,
        directory=directory,
        object_store=None if shared is None else shared.to_spec(),
        policy="tinylfu" if device is None else device.policy,
        listener=reporter,
        local_node_id=node_id,
        tenant_share=config.server.tenant_cache_share,
        device_compression=NONE if device is None else device.compression,
        gate=VerdictGate(verdict_book(config)),
    )
    IndexWatch(index, tiered, reporter, tiers=DEVICE_ONLY).start()  # refills the index should it restart empty
    return tiered, directory


def node_shard_config(config: ServeConfig) -> ShardConfig | None:
    """The configured node shard (its RAM and SSD tiers), or None when the configuration has neither."""
    ram, ssd = config.tier("ram"), config.tier("ssd")
    if ram is None and ssd is None:
        return None
    book = verdict_book(config)
    return ShardConfig(
        ram_capacity_bytes=0 if ram is None else ram.capacity_bytes,
        ssd_url=None if ssd is None else ssd.url,
        ssd_capacity_bytes=0 if ssd is None else ssd.capacity_bytes,
        policy=(ram or ssd).policy,
        tenant_share=config.server.tenant_cache_share,
        ram_compression=NONE if ram is None else ram.compression,
        ssd_compression=NONE if ssd is None else ssd.compression,
        verdicts_url=book.url,
        verdicts_options=book.storage_options,
    )


def open_node_shards(config: ServeConfig, index: ActorHandle) -> ShardDirectory | None:
    """This node's shard started if absent, and the directory of every live one (None without shard tiers)."""
    shard = node_shard_config(config)
    if shard is None:
        return None
    ensure_local_shard(shard, index)
    # The heartbeat's refresh starts this node's shard again should it be killed for good.
    return ShardDirectory.discover(index, keep_local=shard)


def worker_dtype(config: ServeConfig, path: Path) -> str:
    """The configured dtype made concrete: `auto` once per deployment, by the first worker's hardware."""
    vllm = config.engine.kind == "vllm"
    on_gpu = vllm and config.engine.vllm.device != "cpu" and torch.cuda.is_available()
    own = resolve_dtype(config.model.dtype, path, on_gpu)
    if config.model.dtype != AUTO:
        return own
    # The dtype is part of every chunk key: workers that chose apart would never share a chunk.
    settled = ray.get(launch_membership().settle_dtype.remote(config.model.served_name, own))
    if settled != own:
        _log.warning("blendserve: model.dtype auto is %s for this deployment; this machine alone would choose %s "
                     "(%s)", settled, own, Hardware.detect().description)
    return settled


def load_worker(config: ServeConfig, worker_id: str, tiered: TieredStore) -> tuple[Worker, str]:
    """The configured model in the configured engine over `tiered`, and the KV fingerprint (model and dtype)."""
    path = config.model.path or prepare_default_model()
    dtype = worker_dtype(config, path)
    _log.info("blendserve: worker %s computes in %s (model.dtype %s; %s)", worker_id, dtype, config.model.dtype,
              Hardware.detect().description)
    engine = open_engine(config, path, dtype, lambda runner: serving_fuser(config, runner, tiered))
    fuser = engine.fuser
    if config.fusion.plan == "auto" and fuser.blending_refused is None:
        engine.planner = RequestPlanner(calibrate_planner(engine, config.fusion.mode, config.fusion.recompute_ratio))
    guardrails = config.guardrails
    shadow = ShadowSampler(engine, guardrails.shadow_fraction) if guardrails.shadow_fraction > 0 else None
    return Worker(engine, worker_id, shadow, fuser.blending_refused is not None), fuser.runner.checkpoint.fingerprint


def open_engine(config: ServeConfig, path: Path, dtype: str, make_fuser: Callable[[ModelRunner], Fuser]) -> Engine:
    """The configured engine, loaded in `dtype`, around the one Fuser `make_fuser` builds on its runner."""
    if config.engine.kind == "vllm":
        from workers.vllm.engine import VLLMEngine  # imports vllm: only where the vLLM engine is configured

        scratch = config.data_dir.absolute() / "vllm"
        return VLLMEngine.start(path, scratch, config.engine.vllm, dtype, make_fuser)
    torch.set_num_threads(config.engine.num_threads or os.cpu_count() or 1)
    return TorchEngine(make_fuser(ModelRunner(load_checkpoint(path, torch_dtype(dtype)))))


def serving_fuser(config: ServeConfig, runner: ModelRunner, tiered: TieredStore) -> Fuser:
    """The configured fusion on `runner` over the tiered store; its guardrails are applied as it is built."""
    template = config.prompt.template(runner.checkpoint.tokenizer)
    guardrails = config.guardrails
    options = FusionOptions(
        recompute_ratio=config.fusion.recompute_ratio,
        selection_span_tokens=config.fusion.selection_span_tokens,
        fallback=FallbackOptions(min_coverage=guardrails.fallback_min_coverage),
    )
    on_gpu = runner.device.type != "cpu"
    chunk_store = KVPlaneChunkStore(tiered, runner.checkpoint.fingerprint, runner.device if on_gpu else None)
    fuser = guarded_fuser(runner, options, chunk_store, template, config.engine.chunk_context, guardrails)
    # Before the first request: the stores compress a model's chunk KV only once its verdict is recorded.
    record_missing_verdicts(config, fuser, verdict_book(config))
    return fuser


class Heartbeat:
    """Tells the membership actor every second that this worker is up, with its evictions and guardrails."""

    def __init__(
        self, worker: Worker, node_id: str, fingerprint: str, tiered: TieredStore, directory: ShardDirectory | None,
        model: str,
    ) -> None:
        self._membership = launch_membership()
        self._args = (worker.worker_id, node_id, fingerprint)
        self._worker = worker
        self._tiered = tiered
        self._directory = directory
        self._hardware = Hardware.detect().description
        self._model = model
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="blendserve-heartbeat", daemon=True)
        self.beat()
        self._thread.start()

    def beat(self) -> None:
        """Report once."""
        evictions = {tier: stats.evictions for tier, stats in self._tiered.stats().tiers.items() if tier == "device"}
        shadow = self._worker.shadow
        report = WorkerReport(
            dtype=str(self._worker.engine.dtype).removeprefix("torch."),
            model=self._model,
            hardware=self._hardware,
            max_context_tokens=self._worker.engine.limits.max_context_tokens,
            evictions=evictions,
            blending_refused=self._worker.blending_refused,
            shadow={} if shadow is None else shadow_report(shadow.summary()),
            kv=tier_events(self._tiered.stats()),
        )
        self._membership.heartbeat.remote(*self._args, report)

    def stop(self) -> None:
        """Stop reporting and leave the membership."""
        self._stopped.set()
        self._membership.leave.remote(self._args[0])

    def _loop(self) -> None:
        count = 0
        while not self._stopped.wait(HEARTBEAT_INTERVAL_S):
            count += 1
            try:
                self.beat()
                if self._directory is not None and count % SHARD_REFRESH_EVERY == 0:
                    self._directory.refresh()
            except Exception:  # a heartbeat must never kill the worker; the next one retries
                _log.exception("blendserve: heartbeat failed")


def start_worker(config: ServeConfig, worker_id: str) -> tuple[Worker, Heartbeat]:
    """Load the model, open the store, then announce the worker (it is ready from here on)."""
    node_id = ray.get_runtime_context().get_node_id()
    tiered, directory = open_serving_tiered_store(config, worker_id, node_id)
    worker, fingerprint = load_worker(config, worker_id, tiered)
    return worker, Heartbeat(worker, node_id, fingerprint, tiered, directory, config.model.served_name)


def shadow_report(summary: ShadowSummary) -> dict[str, float]:
    """The shadow comparison's figures a heartbeat carries."""
    return {
        "completed": summary.completed,
        "dropped": summary.dropped,
        "failed": summary.failed,
        "top1_agreement": summary.top1_agreement,
        "first_token_kl_mean": summary.first_token_kl_mean,
        "first_token_kl_max": summary.first_token_kl_max,
    }
