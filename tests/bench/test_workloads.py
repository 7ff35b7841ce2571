"""The serving benchmark's workload generators: replay, BM25 retrieval over a pool, Zipf popularity."""
from collections import Counter

import numpy as np
import pytest

from bench.workloads import (
    Passage,
    PoolQuestion,
    bm25_top_k,
    replay_requests,
    retrieval_requests,
    reuse_profile,
    zipf_requests,
    zipf_weights,
)
from workers.evaluation.dataset import QARecord

POOL = [
    Passage("Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris."),
    Passage("Mount Fuji", "Mount Fuji is the highest volcano in Japan."),
    Passage("Danube", "The Danube river flows through Vienna and Budapest."),
    Passage("Amazon", "The Amazon rainforest covers much of Brazil."),
]
QUESTIONS = [
    PoolQuestion("q0", "Which city has the Eiffel Tower?", ("Paris",)),
    PoolQuestion("q1", "Which river flows through Vienna?", ("Danube",)),
    PoolQuestion("q2", "What is the highest volcano in Japan?", ("Mount Fuji",)),
]


def _records(num: int) -> list[QARecord]:
    return [QARecord(f"r{i}", f"question {i}?", [f"a{i}"], [f"r{i} chunk {j}" for j in range(5)]) for i in range(num)]


def test_replay_shuffles_each_records_chunks_and_swaps_in_the_given_number_of_foreign_ones() -> None:
    requests = replay_requests(_records(4), num_requests=8, num_foreign=2, seed=1)
    assert [r.question for r in requests] == [f"question {i % 4}?" for i in range(8)]
    for request in requests:
        record_id = request.id.split("#")[0]
        own = [d for d in request.documents if d.startswith(f"{record_id} ")]
        assert len(request.documents) == 5 and len(own) >= 3  # a foreign draw may repeat a chunk slot's source
        assert len(request.documents) - len(own) <= 2
    orders = {requests[0].documents, requests[4].documents}
    assert len(orders) == 2  # the same record comes back recombined, not verbatim


def test_bm25_ranks_the_passage_that_answers_first() -> None:
    ranked = bm25_top_k(POOL, [q.question for q in QUESTIONS], top_k=2)
    assert [row[0] for row in ranked] == [0, 2, 1]


def test_retrieval_requests_carry_the_top_k_passages_and_with_skew_repeat_popular_questions() -> None:
    distinct = retrieval_requests(POOL, QUESTIONS, top_k=2, num_requests=3, seed=0)
    assert sorted(r.question for r in distinct) == sorted(q.question for q in QUESTIONS)
    assert all(len(r.documents) == 2 for r in distinct)
    by_question = {r.question: r for r in distinct}
    assert by_question["Which city has the Eiffel Tower?"].documents[0] == POOL[0].document
    with pytest.raises(ValueError):
        retrieval_requests(POOL, QUESTIONS, top_k=2, num_requests=4, seed=0)
    skewed = retrieval_requests(POOL, QUESTIONS, top_k=2, num_requests=60, seed=0, question_skew=2.0)
    counts = Counter(r.question for r in skewed)
    assert len(skewed) == 60 and counts.most_common(1)[0][1] > 30
    assert len({r.id for r in skewed}) == 60


def test_zipf_weights_sum_to_one_and_skew_concentrates_them() -> None:
    assert zipf_weights(10, 0.0) == pytest.approx(np.full(10, 0.1))
    steep = zipf_weights(10, 1.5)
    assert steep.sum() == pytest.approx(1.0) and steep[0] > 0.5 and list(steep) == sorted(steep, reverse=True)
    with pytest.raises(ValueError):
        zipf_weights(0, 1.0)


def test_zipf_requests_repeat_more_with_more_skew() -> None:
    pool = [Passage(f"t{i}", f"text {i}") for i in range(200)]
    flat = reuse_profile(zipf_requests(pool, QUESTIONS, num_docs=4, num_requests=100, skew=0.0, seed=0))
    steep = reuse_profile(zipf_requests(pool, QUESTIONS, num_docs=4, num_requests=100, skew=1.5, seed=0))
    assert steep["distinct_documents"] < flat["distinct_documents"]
    assert steep["repeat_share"] > flat["repeat_share"]
    assert all(len(set(r.documents)) == 4 for r in zipf_requests(pool, QUESTIONS, 4, 20, 1.0, 0))
