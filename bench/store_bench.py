"""Throughput and per-layer latency of each kvplane tier, beside copy and read references.

.venv/bin/python bench/store_bench.py --tiers ram,ssd,s3 --size-mb 64 --out store-bench.json
"""
import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

import numpy as np
import torch

from kvplane.entry import KVEntry
from kvplane.keys import chunk_key
from kvplane.store import TieredStore
from kvplane.tiers.local_s3 import LocalS3, create_bucket, s3_storage_options
from kvplane.tiers.spec import TierSpec

# Chunk geometry of the default model (SmolLM2-135M: 30 layers, 3 KV heads, head dim 64), bf16.
NUM_LAYERS, NUM_KV_HEADS, HEAD_DIM, CHUNK_TOKENS = 30, 3, 64, 256
NUM_ROUNDS = 5
BENCH_FINGERPRINT = "kvplane-bench"
S3_BUCKET = "kvcache"


def run_store_benchmark(tiers: list[str], size_mb: int, out: Path) -> dict:
    """Measure each named tier (`ram`, `ssd`, `s3`) on `size_mb` MiB of chunk KV; write JSON to `out`."""
    unknown = set(tiers) - set(_TIER_SPECS)
    if unknown or size_mb < 1:
        raise ValueError(f"tiers must come from {sorted(_TIER_SPECS)} and size_mb >= 1 (got {tiers}, {size_mb})")
    entries = _chunks(size_mb)
    payload_bytes = sum(entry.nbytes for entry in entries)
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvplane-bench-")))
        results = {}
        for name in tiers:
            spec = stack.enter_context(_TIER_SPECS[name](scratch, 4 * payload_bytes))
            results[name] = _measure_tier(spec, entries)
        reference = _measure_reference(entries, scratch)
    result = {
        "tiers": results,
        "reference": reference,
        "config": {
            "size_mb": size_mb,
            "payload_bytes": payload_bytes,
            "num_chunks": len(entries),
            "chunk_shape": list(entries[0].kv.shape),
            "dtype": "bfloat16",
            "rounds": NUM_ROUNDS,
            "gbps": "1e9 bytes of KV payload per second, median over rounds",
        },
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def _chunks(size_mb: int) -> list[KVEntry]:
    generator = torch.Generator().manual_seed(0)
    shape = (NUM_LAYERS, 2, CHUNK_TOKENS, NUM_KV_HEADS, HEAD_DIM)
    chunk_bytes = int(np.prod(shape)) * torch.bfloat16.itemsize
    entries = []
    for index in range(max(1, round(size_mb * 2**20 / chunk_bytes))):
        token_ids = list(range(index * CHUNK_TOKENS, (index + 1) * CHUNK_TOKENS))
        kv = torch.randn(shape, generator=generator).to(torch.bfloat16)
        entries.append(KVEntry(chunk_key(BENCH_FINGERPRINT, "bench", token_ids), kv, token_ids, BENCH_FINGERPRINT))
    return entries


@contextmanager
def _ram(_scratch: Path, capacity_bytes: int) -> Iterator[TierSpec]:
    yield TierSpec("ram", "ram://", capacity_bytes, "lru")


@contextmanager
def _ssd(scratch: Path, capacity_bytes: int) -> Iterator[TierSpec]:
    yield TierSpec("ssd", f"file://{scratch / 'ssd'}", capacity_bytes, "lru")


@contextmanager
def _s3(_scratch: Path, capacity_bytes: int) -> Iterator[TierSpec]:
    """The configured S3 endpoint (standard AWS_ENDPOINT_URL[_S3]); else a moto server for the run."""
    url = f"s3://{S3_BUCKET}/bench-{uuid.uuid4().hex}"
    configured = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if configured:
        yield TierSpec("s3", url, capacity_bytes, "lru", {"client_kwargs": {"endpoint_url": configured}})
        return
    with LocalS3() as endpoint_url:
        create_bucket(endpoint_url, S3_BUCKET)
        yield TierSpec("s3", url, capacity_bytes, "lru", s3_storage_options(endpoint_url))


_TIER_SPECS: dict[str, Callable[[Path, int], AbstractContextManager[TierSpec]]] = {"ram": _ram, "ssd": _ssd, "s3": _s3}


def _measure_tier(spec: TierSpec, entries: list[KVEntry]) -> dict[str, float]:
    """One tier alone (no promotion or write-back): whole puts, whole gets, then layer-by-layer reads."""
    payload_bytes = sum(entry.nbytes for entry in entries)
    put_gbps, get_gbps, layer_ms = [], [], []
    with TieredStore.from_specs([spec]) as store:
        for _ in range(NUM_ROUNDS):
            put_gbps.append(payload_bytes / _seconds(lambda: [store.put(entry) for entry in entries]) / 1e9)
            get_gbps.append(payload_bytes / _seconds(lambda: [store.get(entry.key) for entry in entries]) / 1e9)
            for entry in entries:
                layer_ms += _layer_latencies_ms(store, entry.key)
            # Same content, same key: a second put of a held chunk is a no-op, so each round starts empty.
            store.invalidate(BENCH_FINGERPRINT)
    return {
        "put_gbps": statistics.median(put_gbps),
        "get_gbps": statistics.median(get_gbps),
        "layer_get_ms_p50": float(np.percentile(layer_ms, 50)),
        "layer_get_ms_p99": float(np.percentile(layer_ms, 99)),
    }


def _layer_latencies_ms(store: TieredStore, key: str) -> list[float]:
    """Time to each layer; the first one includes the header read that opens the stream."""
    latencies = []
    start_s = time.perf_counter()
    stream = store.read_layers(key)
    if stream is None:
        raise RuntimeError(f"benchmark chunk {key} went missing")
    for _layer in stream:
        now_s = time.perf_counter()
        latencies.append((now_s - start_s) * 1e3)
        start_s = now_s
    return latencies


def _measure_reference(entries: list[KVEntry], scratch: Path) -> dict[str, float]:
    """Copy and sequential-read speeds of the same bytes (page cache warm, as for the SSD tier)."""
    arrays = [entry.kv.reshape(-1).view(torch.uint8).numpy() for entry in entries]
    payload_bytes = sum(array.nbytes for array in arrays)
    path = scratch / "reference.bin"
    with open(path, "wb") as file:
        for array in arrays:
            file.write(array)
    targets = [np.empty_like(array) for array in arrays]

    def gbps(work: Callable[[], object]) -> float:
        return statistics.median(payload_bytes / _seconds(work) / 1e9 for _ in range(NUM_ROUNDS))

    return {
        "memcpy_gbps": gbps(lambda: [np.copy(array) for array in arrays]),
        "file_read_gbps": gbps(path.read_bytes),
        # Two stricter bounds. Copying into memory already mapped skips first-touch page faults (no get
        # can: it hands out new memory); reading into a numpy buffer gets huge pages, as the SSD tier does.
        "memcpy_into_existing_gbps": gbps(lambda: [np.copyto(t, a) for t, a in zip(targets, arrays)]),
        "file_readinto_numpy_gbps": gbps(lambda: _read_into_numpy(path)),
    }


def _read_into_numpy(path: Path) -> np.ndarray:
    buffer = np.empty(path.stat().st_size, dtype=np.uint8)
    with open(path, "rb", buffering=0) as file:
        file.readinto(buffer)
    return buffer


def _seconds(work: Callable[[], object]) -> float:
    start_s = time.perf_counter()
    work()
    return time.perf_counter() - start_s


def main() -> None:
    """Parse arguments, measure, print the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiers", default="ram,ssd,s3", help="comma-separated tiers to measure")
    parser.add_argument("--size-mb", type=int, default=64, help="MiB of chunk KV written and read per tier")
    parser.add_argument("--out", type=Path, default=Path("store-bench.json"))
    args = parser.parse_args()
    result = run_store_benchmark([t.strip() for t in args.tiers.split(",") if t.strip()], args.size_mb, args.out)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
