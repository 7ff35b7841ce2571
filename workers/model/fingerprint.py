"""The identity of cached KV: a hash over a model's config, weights and tokenizer files and the compute dtype."""
from pathlib import Path

import xxhash

FINGERPRINT_PATTERNS = ("config.json", "*.safetensors", "tokenizer.json", "tokenizer_config.json", "*.model")
READ_BLOCK_BYTES = 8 << 20


def model_fingerprint(path: Path, dtype: str) -> str:
    """xxh3-128 over the compute dtype and the names and bytes of every file that changes the KV computed."""
    digest = xxhash.xxh3_128()
    # KV computed in bf16 differs from float32 KV of the same weights: it must never be read as the other.
    digest.update(b"dtype\0" + dtype.encode() + b"\0")
    files = sorted({f for pattern in FINGERPRINT_PATTERNS for f in Path(path).glob(pattern)})
    for f in files:
        digest.update(f.name.encode() + b"\0")
        with open(f, "rb") as handle:
            while block := handle.read(READ_BLOCK_BYTES):
                digest.update(block)
    return digest.hexdigest()
