"""How far compressed chunk KV is from the exact KV: relative squared error of keys and values, per variant.

A cheap proxy for choosing a variant before the fidelity runs: real chunks of the default model (2wiki pool
passages, computed after the template's prefix as the server stores them), int8, the 4-bit default and 4-bit
with other group sizes, each also with the chunk's first token kept exact.
.venv/bin/python bench/compression_error.py --chunks 6 --out docs/results/compression/error.json
"""
import argparse
import json
from pathlib import Path

import torch

from kvplane.compression.base import Compression
from kvplane.compression.int4 import Int4
from kvplane.compression.registry import compression
from workers.chunks.kv import compute_chunk_kv
from workers.fuser import Fuser
from workers.model.checkpoint import load_checkpoint
from workers.model.default import prepare_default_model
from workers.model.dtype import measured_on
from workers.model.runner import ModelRunner

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "2wiki_pool" / "corpus.json"
VARIANTS: dict[str, Compression] = {
    "int8": compression("int8"),
    "int4 (keys 64 tokens, values 64 channels: the default)": compression("int4"),
    "int4 keys 32, values 32": Int4("int4-32-32", 32, 32),
    "int4 keys 64, values 32": Int4("int4-64-32", 64, 32),
    "int4 keys 32, values 64": Int4("int4-32-64", 32, 64),
    "int4 keys 128, values 64": Int4("int4-128-64", 128, 64),
}


def chunk_kvs(num_chunks: int) -> list[torch.Tensor]:
    """KV `[L, 2, T, H_kv, D]` of the first pool passages of at least 100 tokens, after the template's prefix."""
    checkpoint = load_checkpoint(prepare_default_model(), torch.float32)
    fuser = Fuser(ModelRunner(checkpoint))
    kvs = []
    for passage in json.loads(CORPUS.read_text()):
        prompt = fuser.layout([f"{passage['title']}\n{passage['text']}"], "")
        if len(prompt.chunk_ids[0]) >= 100:
            kvs.append(compute_chunk_kv(fuser.runner, prompt.chunk_ids[0], prompt.chunk_context_ids).kv)
        if len(kvs) == num_chunks:
            return kvs
    raise ValueError(f"the pool has fewer than {num_chunks} passages of 100 tokens")


def relative_errors(codec: Compression, kvs: list[torch.Tensor], exact_first: int) -> dict[str, float]:
    """Squared error over squared norm of keys and of values, the first `exact_first` tokens kept exact."""
    errors, norms, stored, exact_bytes = [0.0, 0.0], [0.0, 0.0], 0, 0
    for kv in kvs:
        part = kv[:, :, exact_first:]
        data = torch.stack([codec.compress(layer) for layer in part])
        out = codec.decompress(data, tuple(part.shape[1:]), torch.float32)
        for index in (0, 1):
            errors[index] += float((out[:, index] - part[:, index]).pow(2).sum())
            norms[index] += float(kv[:, index].pow(2).sum())
        stored += data.numel() + kv[:, :, :exact_first].numel() * 2  # exact tokens kept in bf16
        exact_bytes += kv.numel() * 2
    return {"keys": errors[0] / norms[0], "values": errors[1] / norms[1], "ratio_vs_bfloat16": exact_bytes / stored}


def main() -> None:
    """Parse arguments, measure every variant, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=6)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    kvs = chunk_kvs(args.chunks)
    result = {"chunks": len(kvs), "tokens": sum(kv.shape[2] for kv in kvs), **measured_on(torch.float32),
              "variants": {}}
    for label, codec in VARIANTS.items():
        for exact_first in (0, 1):
            name = label + (", first token exact" if exact_first else "")
            result["variants"][name] = relative_errors(codec, kvs, exact_first)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, figures in result["variants"].items():
        print(f"{name}: " + ", ".join(f"{k} {v:.3g}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
