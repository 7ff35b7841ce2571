"""Run fusion modes side by side on the same records: answers through the engine, divergence through its fusion."""
import json
import statistics
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from kvplane.compression.registry import NONE
from workers.chunks.compressed_view import CompressedView
from workers.engines.base import BlendRequest, BlendResult, Engine
from workers.evaluation.bootstrap import bootstrap_interval, paired_ratio_interval
from workers.evaluation.dataset import QARecord
from workers.evaluation.scoring import best_f1, contains_answer, normalize_answer, token_f1
from workers.generation.divergence import TeacherForced, teacher_forced_divergence
from workers.generation.prompt import PromptLayout
from workers.generation.sampling import SamplingParams
from workers.generation.teacher_forced import answer_logprobs

REFERENCE_MODE = "full_prefill"
NAMESPACE = "eval"
T = TypeVar("T")
# per-record figures summarised as a mean with a 95% bootstrap interval over records
QUALITY_METRICS = ("f1", "accuracy", "agreement_f1", "exact_match", "first_token_agreement", "first_token_kl",
                   "tf_kl", "tf_nll_gap")


@dataclass(frozen=True, slots=True)
class EvalRun:
    """One column of the comparison: a mode at a ratio, reading chunk KV under a compression, reported as `label`."""

    label: str
    mode: str
    ratio: float
    kv_compression: str = NONE


@dataclass(frozen=True, slots=True)
class EngineAccess:
    """What the evaluation needs of an engine besides serving: where its fusion runs and how much it computes."""

    engine: Engine
    call: Callable[[Callable[[], Any]], Any]  # runs a task where the engine computes (the vLLM engine's thread)
    fuses_question: bool  # the torch engine's fusion computes the question's KV too; the vLLM engine's does not
    # Forgets fused contexts the engine keeps (vLLM's prefix cache holds a fused context under its chunks' keys,
    # which do not name the compression a run read them under)
    forget_fused: Callable[[], None] = lambda: None
    # Drops the chunk KV a record stored: records are scored one by one, and an unbounded store would hold
    # every record's chunks (~140 MB a 6k-token musique record in bf16) until memory runs out
    forget_chunks: Callable[[], None] = lambda: None

    def kv_end(self, prompt: PromptLayout) -> int:
        """How many leading prompt tokens the engine's fusion computes KV for."""
        total = len(prompt.token_ids)
        return total if self.fuses_question else max(1, total - len(prompt.suffix_ids))


def direct_access(engine: Engine) -> EngineAccess:
    """The torch engine: everything on the caller's thread, the whole prompt fused."""
    return EngineAccess(engine, lambda task: task(), fuses_question=True)


def engine_thread_access(engine: Any) -> EngineAccess:
    """The vLLM engine: fusion on its engine thread (`engine.call`), the context fused, vLLM prefills the question."""
    return EngineAccess(engine, engine.call, fuses_question=False, forget_fused=engine.forget_fused_contexts)


@dataclass(frozen=True, slots=True)
class RecordScore:
    """One run on one record."""

    record: str
    label: str
    mode: str
    ratio: float
    answer: str
    f1: float  # against the gold answers
    agreement_f1: float  # against the full-prefill answer
    exact_match: float  # 1.0 when the normalised answer equals the full-prefill one
    first_token_agreement: float  # 1.0 when the first generated token is full prefill's
    first_token_kl: float | None  # KL(full || mode) of the first token's distribution (None: not measured)
    tf_kl: float | None  # mean KL(full || mode) along the full-prefill answer's tokens
    tf_nll_gap: float | None  # mean NLL gap of those tokens
    ttft_s: float
    recomputed_fraction: float
    context_tokens: int
    accuracy: float | None = None  # 1.0 when a gold answer appears in the answer (None: rows written before it)
    kv_compression: str = NONE  # how the run's chunk KV was stored


def evaluate(
    access: EngineAccess,
    records: Iterable[QARecord],
    runs: list[EvalRun],
    max_new_tokens: int = 32,
    teacher_forced: bool = True,
    on_record: Callable[[int, list[RecordScore]], None] | None = None,
    warm_up: bool = True,
) -> tuple[list[RecordScore], float]:
    """Score every run on every record against the gold answers and the full-prefill answer.

    Chunk KV is stored before any timed request. The teacher-forced figures fuse the prompt again with the
    run's mode (not timed) and feed the full-prefill answer through the engine's fusion runner. Returns every
    record's scores and the seconds spent storing chunk KV.
    """
    engine = access.engine
    sampling = SamplingParams(max_new_tokens=max_new_tokens)
    if warm_up:
        engine.generate(
            BlendRequest(["warm-up"], "warm-up?", REFERENCE_MODE, sampling=SamplingParams(max_new_tokens=2))
        )
    scores: list[RecordScore] = []
    store_s = 0.0
    for index, record in enumerate(records):
        prompt = engine.fuser.layout(record.documents, record.question, record.conversation)
        start_s = time.perf_counter()
        # Every chunk stored as this prompt reads it: after the one-question prefix, or (a chat under
        # chunks_after "request_prefix") after this prompt's own.
        access.call(lambda prompt=prompt: engine.fuser.precompute(prompt, NAMESPACE))
        store_s += time.perf_counter() - start_s
        reference = _answer(engine, record, REFERENCE_MODE, 1.0, sampling)
        reference_logprobs = (
            _logprobs(access, prompt, REFERENCE_MODE, 1.0, reference.token_ids) if teacher_forced else None
        )
        rows = []
        for run in runs:
            if run.kv_compression != NONE:  # else its answer would reuse the fused context of a run before it
                access.forget_fused()
            with _reading(engine, run.kv_compression):
                result = reference if run.mode == REFERENCE_MODE else _answer(engine, record, run.mode, run.ratio,
                                                                              sampling)
                divergence = None
                if reference_logprobs is not None and run.mode != REFERENCE_MODE:
                    logprobs = _logprobs(access, prompt, run.mode, run.ratio, reference.token_ids)
                    targets = torch.tensor(reference.token_ids)
                    divergence = teacher_forced_divergence(reference_logprobs, logprobs, targets)
            rows.append(_score(record, run, result, reference, divergence))
        access.call(access.forget_chunks)
        scores += rows
        if on_record is not None:
            on_record(index, rows)
    return scores, store_s


def summarise(scores: list[RecordScore], runs: list[EvalRun] | None = None) -> dict[str, dict[str, Any]]:
    """Per label: each quality metric's mean and 95% bootstrap interval over records, TTFT median and mean."""
    labels = [run.label for run in runs] if runs is not None else list(dict.fromkeys(s.label for s in scores))
    summary = {}
    for label in labels:
        rows = [s for s in scores if s.label == label]
        if not rows:
            continue
        entry: dict[str, Any] = {"mode": rows[0].mode, "ratio": rows[0].ratio, "records": len(rows)}
        for metric in QUALITY_METRICS:
            values = [getattr(s, metric) for s in rows]
            if any(v is None for v in values):
                continue
            entry[metric] = statistics.fmean(values)
            entry[f"{metric}_ci95"] = list(bootstrap_interval(values))
        entry.update(_relative_accuracy(rows, [s for s in scores if s.mode == REFERENCE_MODE]))
        ttft = [s.ttft_s for s in rows]
        entry.update(
            ttft_s_median=statistics.median(ttft),
            ttft_s_mean=statistics.fmean(ttft),
            context_tokens_mean=statistics.fmean(s.context_tokens for s in rows),
            recomputed_fraction=statistics.fmean(s.recomputed_fraction for s in rows),
        )
        summary[label] = entry
    return summary


def _relative_accuracy(rows: list[RecordScore], reference: list[RecordScore]) -> dict[str, Any]:
    """Accuracy over full prefill's on the same records, with its paired bootstrap interval (none if unmeasured)."""
    by_record = {s.record: s.accuracy for s in reference if s.accuracy is not None}
    pairs = [(s.accuracy, by_record[s.record]) for s in rows if s.accuracy is not None and s.record in by_record]
    if not pairs or sum(b for _, b in pairs) == 0:
        return {}
    mine, theirs = [a for a, _ in pairs], [b for _, b in pairs]
    return {"relative_accuracy": sum(mine) / sum(theirs),
            "relative_accuracy_ci95": list(paired_ratio_interval(mine, theirs))}


def pending_records(records: list[QARecord], done: list[RecordScore], labels: list[str]) -> list[QARecord]:
    """The records not yet scored under every label (rows of an interrupted run: it resumes with these)."""
    scored: dict[str, set[str]] = {}
    for row in done:
        scored.setdefault(row.record, set()).add(row.label)
    return [record for record in records if not set(labels) <= scored.get(record.id, set())]


def score_row(score: RecordScore) -> dict[str, Any]:
    """A record's score as a JSON object."""
    return asdict(score)


def read_rows(path: Path) -> list[RecordScore]:
    """Record scores written one JSON object a line by score_row (none when the file does not exist)."""
    if not path.exists():
        return []
    return [RecordScore(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def _reading(engine: Engine, kv_compression: str) -> AbstractContextManager[None]:
    """Chunk KV read under `kv_compression` inside the block (the store must be a CompressedView unless none)."""
    store = engine.fuser.store
    if isinstance(store, CompressedView):
        return store.serving(kv_compression)
    if kv_compression != NONE:
        raise ValueError(f"kv_compression {kv_compression!r} needs the evaluation engines' CompressedView store")
    return nullcontext()


def _answer(engine: Engine, record: QARecord, mode: str, ratio: float, sampling: SamplingParams) -> BlendResult:
    return engine.generate(
        BlendRequest(record.documents, record.question, mode, ratio, sampling, NAMESPACE,
                     conversation=record.conversation)
    )


def _logprobs(access: EngineAccess, prompt: PromptLayout, mode: str, ratio: float, answer: list[int]) -> torch.Tensor:
    fuser = access.engine.fuser
    return access.call(lambda: answer_logprobs(fuser, prompt, mode, ratio, answer, access.kv_end(prompt), NAMESPACE))


def _score(
    record: QARecord, run: EvalRun, result: BlendResult, reference: BlendResult, divergence: TeacherForced | None
) -> RecordScore:
    same = result is reference  # full prefill against itself: no divergence by definition
    return RecordScore(
        record=record.id,
        label=run.label,
        mode=run.mode,
        ratio=run.ratio,
        answer=result.text,
        f1=best_f1(result.text, record.answers),
        agreement_f1=token_f1(result.text, reference.text),
        exact_match=float(normalize_answer(result.text) == normalize_answer(reference.text)),
        first_token_agreement=float(result.token_ids[:1] == reference.token_ids[:1]),
        first_token_kl=0.0 if same else None if divergence is None else divergence.first_token_kl,
        tf_kl=0.0 if same else None if divergence is None else divergence.kl,
        tf_nll_gap=0.0 if same else None if divergence is None else divergence.nll_gap,
        ttft_s=result.stats.ttft_s,
        recomputed_fraction=result.stats.recomputed_fraction,
        context_tokens=result.stats.context_tokens,
        accuracy=contains_answer(result.text, record.answers),
        kv_compression=run.kv_compression,
    )
