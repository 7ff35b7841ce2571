"""The engines an evaluation can run on, loaded with the fusion options it compares."""
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from workers.chunks.compressed_view import CompressedView
from workers.chunks.sources import DEFAULT_CHUNK_CONTEXT
from workers.engines.torch_engine import TorchEngine
from workers.evaluation.evaluate import EngineAccess, direct_access, engine_thread_access
from workers.fuser import Fuser
from workers.fusion.base import FusionMode, FusionOptions
from workers.generation.prompt import PromptTemplate
from workers.model.checkpoint import load_checkpoint
from workers.model.default import prepare_default_model
from workers.model.dtype import resolve_dtype, torch_dtype
from workers.model.runner import ModelRunner

ENGINE_KINDS = ("torch", "vllm")
MAX_MODEL_LEN = 8192  # the longest shared records are ~6.4k tokens plus the answer


def load_eval_engine(
    kind: str,
    model: Path | None = None,
    dtype: str = "auto",
    options: FusionOptions = FusionOptions(),
    chunk_context: str = DEFAULT_CHUNK_CONTEXT,
    modes: Mapping[str, FusionMode] | None = None,
    chunks_after: str = "default_prefix",
    kv_compressions: Sequence[str] = (),
) -> EngineAccess:
    """The torch engine, or the vLLM engine (vLLM prefills the question and decodes), with `options`' modes.

    `modes`: the strategies requests may name (the registry's, built from `options`, by default); `chunks_after`:
    what a chat's chunk KV is computed after (PromptTemplate); `kv_compressions`: under which compressions runs
    may read chunk KV (EvalRun.kv_compression).
    """
    if kind not in ENGINE_KINDS:
        raise ValueError(f"engine must be one of {ENGINE_KINDS}, got {kind!r}")
    path = model or prepare_default_model()

    def make_fuser(runner: ModelRunner) -> Fuser:
        template = PromptTemplate(runner.checkpoint.tokenizer, chunks_after=chunks_after)
        # Chunk KV in a CompressedView: runs may read it as a compressed tier would serve it.
        store = CompressedView(kv_compressions)
        return Fuser(runner, options, store=store, template=template, chunk_context=chunk_context, modes=modes)

    access = _start(kind, path, dtype, make_fuser)
    return replace(access, forget_chunks=access.engine.fuser.store.clear)


def _start(kind: str, path: Path, dtype: str, make_fuser: Callable[[ModelRunner], Fuser]) -> EngineAccess:
    """The torch engine on the caller's thread, or the vLLM engine on its own, over `make_fuser`'s fuser."""
    if kind == "torch":
        checkpoint = load_checkpoint(path, torch_dtype(resolve_dtype(dtype, path, on_gpu=False)))
        return direct_access(TorchEngine(make_fuser(ModelRunner(checkpoint))))
    from workers.vllm.engine import VLLMEngine  # imports vllm: only when asked for
    from workers.vllm.settings import VLLMSettings

    scratch = Path(tempfile.mkdtemp(prefix="blendserve-eval-"))
    settings = VLLMSettings(max_model_len=MAX_MODEL_LEN)
    return engine_thread_access(VLLMEngine.start(path, scratch, settings, resolve_dtype(dtype, path), make_fuser))
