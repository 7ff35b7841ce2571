"""A load ramp on the real app takes the workers from 1 to 2 replicas and back, within the configured delays."""
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.cluster.conftest import running_app

POLICY = {
    "min_replicas": 1, "max_replicas": 2, "target_queue_per_replica": 1.0, "ttft_slo_s": 30.0,
    "upscale_delay_s": 2.0, "downscale_delay_s": 10.0, "look_back_period_s": 3.0, "metrics_interval_s": 0.5,
}
RAMP_CONFIG = {
    "workers": {"num_replicas": 1, "num_cpus": 1},
    "engine": {"kind": "torch", "num_threads": 1},
    "guardrails": {"canary": False},
    "admission": {"max_queued_per_worker": 8},
    "autoscaling": POLICY,
    "limits": {"max_documents": 8, "max_tokens": 32, "default_max_tokens": 16, "max_request_body_bytes": 65536},
}
CLIENTS = 6
# Serve's queue figure, counted at the ingress's handle, is pushed on Ray's own clock (10 s by default).
HANDLE_PUSH_INTERVAL_S = "0.5"
# A new replica loads the model before it counts as running; the policy itself acts within its delays.
SCALE_UP_TIMEOUT_S = 120.0
SCALE_DOWN_SLACK_S = 20.0


@pytest.fixture(scope="module")
def ramp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S", HANDLE_PUSH_INTERVAL_S)
        with running_app(tmp_path_factory.mktemp("ramp"), RAMP_CONFIG) as base_url:
            yield base_url


def _running_workers() -> int:
    from ray import serve

    deployment = serve.status().applications["blendserve"].deployments["WorkerDeployment"]
    return deployment.replica_states.get("RUNNING", 0)


def _wait_for(replicas: int, timeout_s: float) -> float:
    """Seconds until exactly `replicas` workers run; fails past `timeout_s`."""
    start_s = time.monotonic()
    while _running_workers() != replicas:
        elapsed_s = time.monotonic() - start_s
        assert elapsed_s < timeout_s, f"{_running_workers()} workers after {elapsed_s:.0f} s, expected {replicas}"
        time.sleep(0.2)
    return time.monotonic() - start_s


def _client(base_url: str, stop: threading.Event, statuses: list[int]) -> None:
    body = {
        "messages": [{"role": "user", "content": "Summarise the documents."}], "max_tokens": 16,
        "documents": [{"text": "The Danube flows through Vienna, Budapest and Belgrade."},
                      {"text": "The Rhine rises in the Swiss Alps and reaches the North Sea."}],
    }
    with httpx.Client(base_url=base_url, timeout=120) as client:
        while not stop.is_set():
            statuses.append(client.post("/v1/chat/completions", json=body).status_code)


@pytest.mark.slow
def test_a_load_ramp_adds_a_worker_and_quiet_removes_it(ramp_server: str):
    assert _running_workers() == 1
    stop = threading.Event()
    statuses: list[int] = []
    clients = [threading.Thread(target=_client, args=(ramp_server, stop, statuses)) for _ in range(CLIENTS)]
    for client in clients:
        client.start()
    try:
        up_s = _wait_for(2, SCALE_UP_TIMEOUT_S)
    finally:
        stop.set()
        for client in clients:
            client.join()
    # The queue held over its target for at least the upscale delay before Serve acted.
    assert up_s >= POLICY["upscale_delay_s"]
    assert 200 in statuses and set(statuses) <= {200, 429}
    # Quiet: the queue empties, the TTFTs leave the window, and the downscale delay must pass.
    down_s = _wait_for(1, POLICY["look_back_period_s"] + POLICY["downscale_delay_s"] + SCALE_DOWN_SLACK_S)
    assert down_s >= POLICY["downscale_delay_s"]
