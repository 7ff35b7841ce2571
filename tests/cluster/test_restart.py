"""Ray restarted under the app: the node shard finds its SSD entries again (new Ray node id, same SSD folder)."""
import time
from typing import Any

import httpx
import pytest

from tests.cluster.conftest import running_app

pytestmark = pytest.mark.slow

DOCS = ["The Rhine rises in the Swiss Alps and reaches the North Sea in the Netherlands.",
        "The Danube crosses ten countries, more than any other river in the world."]
CONFIG: dict[str, Any] = {
    "workers": {"num_replicas": 1, "num_cpus": 1},
    "engine": {"kind": "torch", "num_threads": 1},
    "guardrails": {"canary": False},
}


def store(base_url: str) -> list[dict[str, Any]]:
    response = httpx.post(f"{base_url}/v1/documents", json={"documents": [{"text": d} for d in DOCS]}, timeout=180)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def test_a_restarted_ray_finds_the_ssd_entries_of_the_node(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("rs")
    with running_app(root, CONFIG) as base_url:
        first = store(base_url)
        assert all(doc["computed"] for doc in first)
        keys = {doc["key"] for doc in first}
        deadline_s = time.monotonic() + 30  # the shard writes its SSD in the background
        while not keys <= {path.name for path in (root / "data" / "kv").rglob("*")} and time.monotonic() < deadline_s:
            time.sleep(0.5)
        before = httpx.get(f"{base_url}/metrics", timeout=30).text
    with running_app(root, CONFIG) as base_url:  # Ray, Serve and the shard all start anew, same data folder
        again = store(base_url)
        metrics = httpx.get(f"{base_url}/metrics", timeout=30).text
    assert [doc["key"] for doc in again] == [doc["key"] for doc in first]
    assert not any(doc["computed"] for doc in again) and all("ssd" in doc["tiers"] for doc in again)
    shard_line = next(line for line in metrics.splitlines() if line.startswith("blendserve_kv_shard_recovered"))
    assert float(shard_line.split()[-1]) >= len(DOCS)
    old_holder = next(line for line in before.splitlines() if line.startswith("blendserve_kv_shard_up"))
    assert old_holder.split("{")[1] != shard_line.split("{")[1]  # a new node id, the same entries
