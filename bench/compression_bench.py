"""Compressed chunk KV against uncompressed, side by side: bytes, encode and decode speed, load time per tier.

Chunk KV is the default model's own, computed over passages of the 2wiki pool in the serving dtype.
.venv/bin/python bench/compression_bench.py --chunks 24 --out docs/results/compression/bench_xeon_amx.json
"""

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path

import torch

from kvplane.codec import decode, encode, read_header
from kvplane.compression.registry import COMPRESSIONS
from kvplane.entry import KVEntry
from kvplane.keys import chunk_key
from kvplane.store import TieredStore
from kvplane.tiers.local_s3 import LocalS3, create_bucket, s3_storage_options
from kvplane.tiers.spec import TierSpec
from workers.chunks.kv import compute_chunk_kv
from workers.model.checkpoint import load_checkpoint
from workers.model.default import prepare_default_model
from workers.model.dtype import AUTO, measured_on, resolve_dtype, torch_dtype
from workers.model.runner import ModelRunner

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "2wiki_pool" / "corpus.json"
ROUNDS = 7
TIERS = ("ram", "ssd", "s3")
BUCKET = "kvcache"


def real_chunks(num_chunks: int, dtype: str) -> list[KVEntry]:
    """KV of the first passages of the 2wiki pool with at least 100 tokens, computed alone by the default model."""
    checkpoint = load_checkpoint(prepare_default_model(), torch_dtype(dtype))
    runner = ModelRunner(checkpoint)
    entries = []
    for passage in json.loads(CORPUS.read_text()):
        ids = checkpoint.tokenizer.encode(f"{passage['title']}\n{passage['text']}", add_special_tokens=False)
        if len(ids) < 100:
            continue
        kv = compute_chunk_kv(runner, ids).kv
        entries.append(KVEntry(chunk_key(checkpoint.fingerprint, "bench", ids), kv, ids, checkpoint.fingerprint))
        if len(entries) == num_chunks:
            return entries
    raise ValueError(f"the pool has fewer than {num_chunks} passages of 100 tokens")


def seconds(work: Callable[[], object]) -> float:
    start_s = time.perf_counter()
    work()
    return time.perf_counter() - start_s


def consume(results: Iterable[object]) -> None:
    """Run through `results`, keeping none of them."""
    for _ in results:
        pass


def drop_from_page_cache(folder: Path) -> None:
    """Evict the tier's files from the page cache, so the next read comes from the disk."""
    for path in folder.rglob("*"):
        if path.is_file():
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.fsync(descriptor)
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(descriptor)


def measure(entries: list[KVEntry], names: list[str], s3_options: dict, scratch: Path) -> dict:
    """Per compression: bytes, codec speeds and load times from each tier, rounds alternating the compressions."""
    kv_bytes = sum(entry.nbytes for entry in entries)
    tokens = sum(len(entry.token_ids) for entry in entries)
    bf16_bytes = sum(entry.kv.numel() * 2 for entry in entries)
    blobs = {name: [encode(entry, compression_name=name) for entry in entries] for name in names}
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in names}

    def note(name: str, figure: str, value: float) -> None:
        samples[name].setdefault(figure, []).append(value)

    stores = {}
    for name in names:
        ssd = scratch / f"ssd-{name}"
        specs = {
            "ram": TierSpec("ram", "ram://", 1 << 34, "lru", compression=name),
            "ssd": TierSpec("ssd", f"file://{ssd}", 1 << 34, "lru", compression=name),
            "s3": TierSpec("s3", f"s3://{BUCKET}/{name}", 1 << 34, "lru", s3_options, compression=name),
        }
        stores[name] = {tier: TieredStore.from_specs([spec]) for tier, spec in specs.items()}
        for store in stores[name].values():
            for entry in entries:
                store.put(entry)
            store.flush()
    for _ in range(ROUNDS):
        for name in names:
            # Each result is dropped before the next, as a loader consumes a chunk and frees it.
            note(
                name, "encode_s", seconds(lambda name=name: consume(encode(e, compression_name=name) for e in entries))
            )
            note(
                name, "decode_s", seconds(lambda name=name: consume(decode(b, read_header(b).key) for b in blobs[name]))
            )
            for tier, store in stores[name].items():
                # Whole entries (store.get) and the serving path (read_layers: one layer at a time, decoded as it
                # streams), each read cold from the SSD.
                reads = {
                    "get": lambda store=store: consume(store.get(e.key) for e in entries),
                    "layers": lambda store=store: consume(layer for e in entries for layer in store.read_layers(e.key)),
                }
                for read, work in reads.items():
                    if tier == "ssd":
                        drop_from_page_cache(scratch / f"ssd-{name}")
                    note(name, f"{tier}_{read}_s", seconds(work))
    for tiers in stores.values():
        for store in tiers.values():
            store.close()
    results = {}
    for name in names:
        stored = sum(blob.numel() for blob in blobs[name])
        median = {figure: statistics.median(values) for figure, values in samples[name].items()}
        results[name] = {
            "stored_bytes": stored,
            "bytes_per_token": stored / tokens,
            "ratio_vs_bfloat16": bf16_bytes / stored,
            "encode_gbps_of_input": kv_bytes / median["encode_s"] / 1e9,
            "decode_gbps_of_output": kv_bytes / median["decode_s"] / 1e9,
            **{f"{tier}_load_ms_per_chunk": median[f"{tier}_get_s"] / len(entries) * 1e3 for tier in TIERS},
            **{f"{tier}_layer_stream_ms_per_chunk": median[f"{tier}_layers_s"] / len(entries) * 1e3 for tier in TIERS},
            "rounds": {figure: values for figure, values in samples[name].items()},
        }
    return {"tokens": tokens, "kv_bytes": kv_bytes, "bf16_bytes": bf16_bytes, "compressions": results}


def main() -> None:
    """Parse arguments, compute the chunks, measure, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=24, help="real chunks measured")
    parser.add_argument("--compressions", default=",".join(COMPRESSIONS), help="comma-separated, 'none' first")
    parser.add_argument("--dtype", default=AUTO, help="KV dtype (auto: the serving dtype on this CPU)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype, prepare_default_model(), on_gpu=False)
    entries = real_chunks(args.chunks, dtype)
    names = [name.strip() for name in args.compressions.split(",") if name.strip()]
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bs-codec-")))
        endpoint = stack.enter_context(LocalS3())
        create_bucket(endpoint, BUCKET)
        result = measure(entries, names, s3_storage_options(endpoint), scratch)
    result.update(
        measured_on(torch_dtype(dtype)),
        threads=args.threads,
        chunks=len(entries),
        rounds=ROUNDS,
        ssd="page cache dropped (posix_fadvise DONTNEED) before every SSD read",
        s3="moto server on loopback",
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, row in result["compressions"].items():
        figures = {k: round(v, 3) for k, v in row.items() if isinstance(v, float)}
        print(name, json.dumps(figures))


if __name__ == "__main__":
    main()
