"""The identity of a model for cached KV: a hash over its config, weights and tokenizer files."""
from pathlib import Path

import xxhash

FINGERPRINT_PATTERNS = ("config.json", "*.safetensors", "tokenizer.json", "tokenizer_config.json", "*.model")
READ_BLOCK_BYTES = 8 << 20


def model_fingerprint(path: Path) -> str:
    """xxh3-128 over the names and bytes of every file that changes what KV the model computes."""
    digest = xxhash.xxh3_128()
    files = sorted({f for pattern in FINGERPRINT_PATTERNS for f in Path(path).glob(pattern)})
    for f in files:
        digest.update(f.name.encode() + b"\0")
        with open(f, "rb") as handle:
            while block := handle.read(READ_BLOCK_BYTES):
                digest.update(block)
    return digest.hexdigest()
