"""Workloads for `blendserve bench serve`: dataset replay, BM25 retrieval over the 2wiki pool, synthetic Zipf.

python bench/workloads.py replay --data ../shared/data/musique_cacheblend.dev.jsonl --num-requests 20 --out w.jsonl
python bench/workloads.py retrieval --pool ../shared/data/2wiki_pool --top-k 8 --num-requests 200 --out w.jsonl
python bench/workloads.py zipf --pool ../shared/data/2wiki_pool --skew 1.0 --num-requests 200 --out w.jsonl
"""
import argparse
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cluster.bench.workload import WorkloadRequest, write_workload
from workers.evaluation.dataset import QARecord, load_records


@dataclass(frozen=True, slots=True)
class Passage:
    """One passage of a shared pool: a title and its text; the document is both."""

    title: str
    text: str

    @property
    def document(self) -> str:
        """The document text a request carries (title line, then text, as the QA records are read)."""
        return f"{self.title}\n{self.text}"


@dataclass(frozen=True, slots=True)
class PoolQuestion:
    """A question of the pool with its gold answers."""

    id: str
    question: str
    answers: tuple[str, ...]


def load_pool(pool_dir: Path) -> tuple[list[Passage], list[PoolQuestion]]:
    """The 2wiki pool: passages (corpus.json) and questions with their answer aliases (questions.json)."""
    corpus = json.loads((pool_dir / "corpus.json").read_text())
    raw_questions = json.loads((pool_dir / "questions.json").read_text())
    passages = [Passage(p["title"], p["text"]) for p in corpus]
    questions = [
        PoolQuestion(str(q["id"]), q["question"], tuple(dict.fromkeys([q["answer"], *q.get("answer_aliases", [])])))
        for q in raw_questions
    ]
    return passages, questions


def replay_requests(
    records: Sequence[QARecord], num_requests: int, num_foreign: int, seed: int
) -> list[WorkloadRequest]:
    """Replay records in turn, each with its chunks shuffled and `num_foreign` of them swapped for other records'.

    Plain prefix caching then finds at most the prompt's fixed prefix; chunk reuse finds every chunk.
    """
    if not records:
        raise ValueError("records must hold at least one record")
    if num_foreign < 0:
        raise ValueError(f"num_foreign must be >= 0, got {num_foreign}")
    rng = random.Random(seed)
    requests = []
    for i in range(num_requests):
        record = records[i % len(records)]
        documents = list(record.documents)
        others = [r for r in records if r is not record]
        for slot in rng.sample(range(len(documents)), min(num_foreign, len(documents)) if others else 0):
            documents[slot] = rng.choice(rng.choice(others).documents)
        rng.shuffle(documents)
        requests.append(WorkloadRequest(f"{record.id}#{i}", record.question, tuple(documents), tuple(record.answers)))
    return requests


def bm25_top_k(passages: Sequence[Passage], queries: Sequence[str], top_k: int) -> list[list[int]]:
    """Indices of the `top_k` best BM25 passages per query, best first (bm25s, English stop words)."""
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([p.document for p in passages], stopwords="en", show_progress=False),
                    show_progress=False)
    ranked, _ = retriever.retrieve(bm25s.tokenize(list(queries), stopwords="en", show_progress=False),
                                   k=top_k, show_progress=False)
    return [[int(i) for i in row] for row in ranked]


def retrieval_requests(
    passages: Sequence[Passage], questions: Sequence[PoolQuestion], top_k: int, num_requests: int, seed: int,
    question_skew: float = 0.0,
) -> list[WorkloadRequest]:
    """Questions with their BM25 top-k passages in rank order: drawn without replacement, or with
    `question_skew` > 0 with replacement by Zipf popularity (popular questions are asked again)."""
    rng = np.random.default_rng(seed)
    if question_skew > 0:
        order = rng.permutation(len(questions))
        ranks = rng.choice(len(questions), size=num_requests, p=zipf_weights(len(questions), question_skew))
        chosen = [questions[order[r]] for r in ranks]
    elif num_requests > len(questions):
        raise ValueError(
            f"num_requests must be <= {len(questions)} questions without question_skew, got {num_requests}"
        )
    else:
        chosen = [questions[i] for i in rng.choice(len(questions), size=num_requests, replace=False)]
    unique = list(dict.fromkeys(chosen))
    ranked = dict(zip(unique, bm25_top_k(passages, [q.question for q in unique], top_k)))
    return [
        WorkloadRequest(f"{q.id}#{i}", q.question, tuple(passages[j].document for j in ranked[q]), q.answers)
        for i, q in enumerate(chosen)
    ]


def zipf_weights(num_items: int, skew: float) -> np.ndarray:
    """Popularity of ranks 1..n under Zipf with exponent `skew` (0 is uniform), summing to 1."""
    if num_items < 1:
        raise ValueError(f"num_items must be >= 1, got {num_items}")
    if skew < 0:
        raise ValueError(f"skew must be >= 0, got {skew}")
    weights = 1.0 / np.arange(1, num_items + 1, dtype=np.float64) ** skew
    return weights / weights.sum()


def zipf_requests(
    passages: Sequence[Passage],
    questions: Sequence[PoolQuestion],
    num_docs: int,
    num_requests: int,
    skew: float,
    seed: int,
) -> list[WorkloadRequest]:
    """Each request: a random question and `num_docs` distinct passages, by Zipf popularity over a shuffled pool."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(passages))  # which passage holds which popularity rank
    weights = zipf_weights(len(passages), skew)
    requests = []
    for i in range(num_requests):
        ranks = rng.choice(len(passages), size=num_docs, replace=False, p=weights)
        question = questions[int(rng.integers(len(questions)))]
        documents = tuple(passages[order[r]].document for r in ranks)
        requests.append(WorkloadRequest(f"{question.id}#{i}", question.question, documents, question.answers))
    return requests


def reuse_profile(requests: Sequence[WorkloadRequest]) -> dict[str, float]:
    """How much the workload repeats itself: distinct documents and the share of document uses that repeat one."""
    uses = Counter(d for r in requests for d in r.documents)
    total = sum(uses.values())
    return {
        "num_requests": len(requests),
        "document_uses": total,
        "distinct_documents": len(uses),
        "repeat_share": 1 - len(uses) / total if total else 0.0,
        "top_document_uses": max(uses.values(), default=0),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="kind", required=True)
    replay = sub.add_parser("replay", help="a QA file's records, chunks shuffled and recombined across requests")
    replay.add_argument("--data", type=Path, required=True)
    replay.add_argument("--records", type=int, default=10, help="distinct records replayed")
    replay.add_argument("--foreign", type=int, default=2, help="chunks per request taken from other records")
    for kind in ("retrieval", "zipf"):
        pool = sub.add_parser(kind)
        pool.add_argument("--pool", type=Path, required=True)
        pool.add_argument("--top-k" if kind == "retrieval" else "--num-docs", type=int, default=8, dest="num_docs")
        if kind == "zipf":
            pool.add_argument("--skew", type=float, default=1.0)
        else:
            pool.add_argument(
                "--question-skew",
                type=float,
                default=0.0,
                help="0: distinct questions; > 0: drawn again by Zipf popularity",
            )
    for command in sub.choices.values():
        command.add_argument("--num-requests", type=int, required=True)
        command.add_argument("--seed", type=int, default=0)
        command.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.kind == "replay":
        requests = replay_requests(load_records(args.data, args.records), args.num_requests, args.foreign, args.seed)
    else:
        passages, questions = load_pool(args.pool)
        if args.kind == "retrieval":
            requests = retrieval_requests(
                passages, questions, args.num_docs, args.num_requests, args.seed, args.question_skew
            )
        else:
            requests = zipf_requests(passages, questions, args.num_docs, args.num_requests, args.skew, args.seed)
    write_workload(args.out, requests)
    print(json.dumps({"out": str(args.out), **reuse_profile(requests)}))


if __name__ == "__main__":
    main()
