"""Faults on the running app (real Ray on loopback, the real model, a real S3 endpoint): every request is answered
correctly or refused with a 5xx and Retry-After, nothing corrupt is used, each component comes back by itself,
and each event shows in /metrics and in the logs."""
import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import httpx
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

from kvplane.keys import key_path
from kvplane.ray.location_index import INDEX_ACTOR_NAME
from kvplane.ray.namespace import RAY_NAMESPACE, named_actors
from kvplane.ray.shard import SHARD_NAME_PREFIX
from kvplane.tiers.local_s3 import LocalS3, create_bucket, s3_storage_options
from scheduler.membership import MEMBERSHIP_ACTOR_NAME
from tests.cluster.conftest import running_app
from tests.cluster.test_serving import MODEL

pytestmark = pytest.mark.slow

BUCKET = "kvcache"
TMPFS_BYTES = 96 << 20
SSD_BYTES = 64 << 20
RECOVERY_S = 120
QUESTION = "Which city is named in the passages?"


def documents(tag: str, count: int = 1) -> list[str]:
    """Fresh passages (never cached before): a city fact and some filler, made unique by `tag`."""
    return [f"Passage {tag}-{i}: the old harbour city of Lisbon sits on seven hills by the river Tagus, "
            f"and its trams climb streets paved with white stone ({tag}, part {i})." for i in range(count)]


class FaultyApp:
    """The app under test, the S3 endpoint behind its object tier, and the means to break and read them."""

    def __init__(self, root: Path, ssd_root: Path, mounted: bool, s3: LocalS3, endpoint: str) -> None:
        self.root = root
        self.ssd_root = ssd_root
        self.mounted = mounted  # the SSD root is a small tmpfs of its own
        self.s3 = s3
        self.endpoint = endpoint
        self.prefix = f"faults-{uuid.uuid4().hex[:8]}"
        self.base_url = ""

    def config(self) -> dict[str, Any]:
        mib = 1 << 20
        return {
            "workers": {"num_replicas": 1, "num_cpus": 1},
            "engine": {"kind": "torch", "num_threads": 1},
            "guardrails": {"canary": False},
            "admission": {"max_queued_per_worker": 4, "initial_service_time_s": 2.0},
            "limits": {"max_documents": 8, "max_tokens": 64, "default_max_tokens": 8},
            "server": {"trust_tenant_header": True, "tenant_cache_share": 1.0},
            # Small, LRU device and RAM tiers: a few uploads push a chunk down to the SSD and the object store.
            "tiers": [
                {"name": "device", "url": "device://", "capacity_bytes": 8 * mib, "policy": "lru"},
                {"name": "ram", "url": "ram://", "capacity_bytes": 8 * mib, "policy": "lru"},
                # Below the tmpfs's size: entries alone never fill the disk, the fill test's filler file does.
                {"name": "ssd", "url": f"file://{self.ssd_root}", "capacity_bytes": SSD_BYTES, "policy": "lru"},
                {"name": "object", "url": f"s3://{BUCKET}/{self.prefix}", "capacity_bytes": 1 << 34, "policy": "lru",
                 "storage_options": s3_storage_options(self.endpoint), "timeout_s": 1.0},
            ],
        }

    def ask(self, docs: list[str], tenant: str, mode: str | None = None, timeout_s: float = 180) -> httpx.Response:
        body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}],
                                "documents": [{"text": d} for d in docs], "max_tokens": 8}
        if mode is not None:
            body["blend"] = {"mode": mode}
        return httpx.post(f"{self.base_url}/v1/chat/completions", json=body, headers={"X-Tenant": tenant},
                          timeout=timeout_s)

    def store(self, docs: list[str], tenant: str) -> list[dict[str, Any]]:
        response = httpx.post(f"{self.base_url}/v1/documents", json={"documents": [{"text": d} for d in docs]},
                              headers={"X-Tenant": tenant}, timeout=180)
        assert response.status_code == 200, response.text
        return response.json()["data"]

    def metric(self, name: str, **labels: str) -> float:
        """The first series of `name` matching `labels` (0 when there is none)."""
        return next(iter(self._samples(name, labels)), 0.0)

    def metric_sum(self, name: str, **labels: str) -> float:
        """The sum over every series of `name` matching `labels` (all holders and tiers, say)."""
        return sum(self._samples(name, labels))

    def _samples(self, name: str, labels: dict[str, str]) -> list[float]:
        text = httpx.get(f"{self.base_url}/metrics", timeout=30).text
        return [
            sample.value for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        ]

    def logs_mention(self, pattern: str) -> bool:
        found = re.compile(pattern)
        for path in (self.root / "ray" / "session_latest" / "logs").rglob("*"):
            if path.is_file() and found.search(path.read_text(errors="replace")):
                return True
        return False

    def shard(self) -> tuple[str, Any]:
        (name, handle), = named_actors(SHARD_NAME_PREFIX).items()
        return name, handle

    def worker_pid(self) -> int:
        """The worker replica's process, among this test's Ray processes only (others may run beside it)."""
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes()
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            if b"ServeReplica:blendserve:WorkerDeployment" in title and f"TMPDIR={self.root}".encode() in environ:
                return int(pid)
        raise LookupError("no worker replica process")

    def ssd_files(self) -> list[Path]:
        return [p for p in self.ssd_root.rglob("*") if p.is_file() and not p.name.startswith(".")]

    def s3_path(self, key: str) -> str:
        return f"{BUCKET}/{self.prefix}/{key_path(key)}"

    def s3_fs(self) -> fsspec.AbstractFileSystem:
        return fsspec.filesystem("s3", **s3_storage_options(self.endpoint), skip_instance_cache=True)


def ssd_file_appears(app: FaultyApp, stored: dict[str, Any], within_s: float = 5.0) -> bool:
    """Whether the shard's background write puts the stored chunk on the SSD soon."""
    deadline_s = time.monotonic() + within_s
    while time.monotonic() < deadline_s:
        if any(path.name == stored["key"] for path in app.ssd_files()):
            return True
        time.sleep(0.5)
    return False


def wait_until(check: Callable[[], object], what: str, timeout_s: float = RECOVERY_S) -> object:
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        try:
            found = check()
        except Exception:  # the component is still coming back
            found = None
        if found:
            return found
        time.sleep(1.0)
    raise TimeoutError(f"{what} within {timeout_s} s")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultyApp]:
    root = tmp_path_factory.mktemp("fx")
    ssd_root = root / "ssd"
    ssd_root.mkdir()
    # A small filesystem of its own lets one test fill the SSD tier's disk (mounting needs root).
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(ssd_root)],
                             capture_output=True).returncode == 0
    s3 = LocalS3()
    try:
        with s3 as endpoint:
            create_bucket(endpoint, BUCKET)
            faulty = FaultyApp(root, ssd_root, mounted, s3, endpoint)
            with running_app(root, faulty.config()) as base_url:
                faulty.base_url = base_url
                yield faulty
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(ssd_root)], check=False)


def answered_correctly(app: FaultyApp, response: httpx.Response, allowed: set[str]) -> None:
    """A 200 whose answer is one the mode gives on a healthy cache or with full prefill, or a 5xx + Retry-After."""
    if response.status_code == 200:
        assert response.json()["choices"][0]["message"]["content"] in allowed, response.json()
    else:
        assert 500 <= response.status_code < 600 and int(response.headers["Retry-After"]) >= 1, response.text


def references(app: FaultyApp, docs: list[str], mode: str | None = None) -> set[str]:
    """The answers the mode gives with a healthy cache (cold: computed; warm: reused) and with full prefill."""
    # One document per request: its chunk is then cached the same way by a request or by /v1/documents (after
    # the prompt prefix), so a hit from any tier reuses the same bytes and gives the warm answer.
    tenant = f"ref-{uuid.uuid4().hex[:6]}"
    answers = {app.ask(docs, tenant, mode).json()["choices"][0]["message"]["content"] for _ in range(2)}
    full = app.ask(docs, f"ref-{uuid.uuid4().hex[:6]}", "full_prefill").json()["choices"][0]["message"]["content"]
    return answers | {full}


def test_a_kvshard_killed_mid_request_comes_back_and_stores_again(app: FaultyApp) -> None:
    docs = documents("shard-kill")
    allowed = references(app, docs)
    name, shard = app.shard()
    pid = ray.get(shard.describe.remote())["pid"]
    with httpx.Client(timeout=180) as client:
        body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}],
                "documents": [{"text": d} for d in docs], "max_tokens": 8, "stream": True}
        with client.stream("POST", f"{app.base_url}/v1/chat/completions", json=body,
                           headers={"X-Tenant": "shard-kill"}) as stream:
            os.kill(pid, signal.SIGKILL)  # while the worker reads and writes the chunks through the shard
            events = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and not any('"error"' in e for e in events)
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) in allowed
    answered_correctly(app, app.ask(docs, "shard-kill"), allowed)
    wait_until(lambda: ray.get(shard.describe.remote(), timeout=5)["restarted"], "the shard restarted")
    # The worker's directory takes the shard back at its next refresh; then writes reach ram and ssd again.
    wait_until(lambda: "ram" in app.store(documents(f"after-{uuid.uuid4().hex[:4]}", 1), "shard-kill")[0]["tiers"],
               "documents stored in the shard again")
    assert app.metric("blendserve_kv_shard_restarted", holder=name) == 1.0
    assert app.logs_mention(rf"kvplane: shard {name} restarted")


def test_a_kvshard_hung_past_its_timeout_is_a_miss_and_rejoins(app: FaultyApp) -> None:
    docs = documents("shard-stop")
    allowed = references(app, docs)
    stored = app.store(docs, "shard-stop")
    app.store(documents("push-down", 12), "shard-stop")  # pushes `docs` out of the device tier
    name, shard = app.shard()
    pid = ray.get(shard.describe.remote())["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        start_s = time.monotonic()
        response = app.ask(docs, "shard-stop")
        took_s = time.monotonic() - start_s
        answered_correctly(app, response, allowed)
        assert took_s < 60
        assert app.metric("blendserve_kv_shard_up", holder=name) == 0.0
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: app.metric("blendserve_kv_shard_up", holder=name) == 1.0, "the shard answered again")
    wait_until(lambda: "ram" in app.store(documents(f"rejoin-{uuid.uuid4().hex[:4]}", 1), "shard-stop")[0]["tiers"],
               "the shard back in the worker's hashing")
    assert stored and app.logs_mention(rf"kvplane: shard {name} is unreachable")


def test_a_worker_killed_mid_stream_ends_the_stream_with_an_error_and_comes_back(app: FaultyApp) -> None:
    docs = documents("worker-kill", 4)
    allowed = references(app, docs, "full_prefill")
    failed_before = app.metric("blendserve_requests_total", endpoint="chat", status="503")
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}],
            "documents": [{"text": d} for d in docs], "max_tokens": 64, "stream": True,
            "blend": {"mode": "full_prefill"}}
    # Killed before it answers, a replica's request is sent again to its successor (Serve's own retry); killed
    # once it streams, the answer cannot be resent: the client must be told.
    pid = app.worker_pid()
    with httpx.Client(timeout=180) as client:
        with client.stream("POST", f"{app.base_url}/v1/chat/completions", json=body,
                           headers={"X-Tenant": f"wk-{uuid.uuid4().hex[:6]}"}) as stream:
            lines = stream.iter_lines()
            while '"content":"' not in (line := next(lines)) or '"content":""' in line:
                pass  # up to the first generated text
            os.kill(pid, signal.SIGKILL)
            rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    errors = [line for line in rest if line.startswith('data: {"error"')]
    assert len(errors) == 1 and "the worker failed" in errors[0], rest
    # Until Serve brings the replica back: refusals with Retry-After, never a hang or a wrong answer.
    deadline_s = time.monotonic() + RECOVERY_S
    while True:
        response = app.ask(docs, "worker-kill", "full_prefill", timeout_s=RECOVERY_S)
        answered_correctly(app, response, allowed)
        if response.status_code == 200 or time.monotonic() > deadline_s:
            break
        time.sleep(int(response.headers["Retry-After"]))
    assert response.status_code == 200
    assert app.metric("blendserve_requests_total", endpoint="chat", status="503") >= failed_before
    assert app.logs_mention(r"failed after it started|the worker failed")


def test_the_location_index_and_membership_killed_come_back(app: FaultyApp) -> None:
    docs = documents("actors")
    allowed = references(app, docs)
    for name in (INDEX_ACTOR_NAME, MEMBERSHIP_ACTOR_NAME):
        ray.kill(ray.get_actor(name, namespace=RAY_NAMESPACE), no_restart=False)
        deadline_s = time.monotonic() + RECOVERY_S
        while True:
            response = app.ask(docs, "actors")
            answered_correctly(app, response, allowed)
            if response.status_code == 200 or time.monotonic() > deadline_s:
                break
            time.sleep(int(response.headers["Retry-After"]))
        assert response.status_code == 200
    wait_until(lambda: app.metric("blendserve_location_index", figure="restarted") == 1.0, "the index restarted")
    wait_until(lambda: app.metric("blendserve_workers_ready") == 1.0, "the worker back in the membership")
    assert app.logs_mention(r"the location index restarted empty")


def test_an_s3_endpoint_stopped_then_killed_is_skipped_and_used_again_when_back(app: FaultyApp) -> None:
    docs = documents("s3-down")
    allowed = references(app, docs)
    worker = app.ask(docs, "s3-warm").json()["blend"]["worker"]
    os.kill(app.s3.pid, signal.SIGSTOP)
    try:
        for i in range(3):  # a new tenant each time: the chunks must be looked up down to the object tier
            start_s = time.monotonic()
            answered_correctly(app, app.ask(docs, f"s3-down-{i}"), allowed)
            assert time.monotonic() - start_s < 60
        wait_until(lambda: app.metric("blendserve_kv_tier_down", holder=worker, tier="object") == 1.0,
                   "the object tier reported down", timeout_s=30)
    finally:
        os.kill(app.s3.pid, signal.SIGCONT)
    app.s3.__exit__()  # killed: the endpoint and everything in it are gone
    answered_correctly(app, app.ask(docs, "s3-down"), allowed)
    app.s3.__enter__()  # back on the same port, empty (the module's fixture stops it at the end)
    create_bucket(app.endpoint, BUCKET)
    wait_until(lambda: "object" in app.store(documents(f"s3-{uuid.uuid4().hex[:4]}", 1), "s3-down")[0]["tiers"],
               "writes reaching the object store again")
    assert app.metric("blendserve_kv_events", holder=worker, tier="object", event="errors") >= 1
    assert app.logs_mention(r"kvplane: tier object failed")


@pytest.mark.parametrize("damage", ["corrupt", "truncate", "delete"])
def test_damaged_ssd_and_s3_entries_are_never_used(app: FaultyApp, damage: str) -> None:
    docs = documents(f"damage-{damage}", 1)
    allowed = references(app, docs)
    tenant = f"damage-{damage}"
    stored = app.store(docs, tenant)[0]
    key = stored["key"]
    app.store(documents(f"push-{damage}", 12), tenant)  # out of the device tier and the shard's RAM
    ssd = wait_until(lambda: next((p for p in app.ssd_files() if p.name == key), None), "the chunk on the SSD", 30)
    s3 = app.s3_fs()
    for path, read, write, remove in (
        (ssd, ssd.read_bytes, ssd.write_bytes, ssd.unlink),
        (app.s3_path(key), lambda: s3.cat_file(app.s3_path(key)), lambda b: s3.pipe_file(app.s3_path(key), b),
         lambda: s3.rm_file(app.s3_path(key))),
    ):
        data = bytearray(read())
        if damage == "corrupt":
            data[len(data) // 2] ^= 0xFF
            write(bytes(data))
        elif damage == "truncate":
            write(bytes(data[: len(data) // 3]))
        else:
            remove()
    damaged = {ssd: ssd.read_bytes() if ssd.exists() else None}
    corruptions_before = app.metric_sum("blendserve_kv_events", event="corruptions")
    response = app.ask(docs, tenant)
    answered_correctly(app, response, allowed)
    # The document's chunk was computed, not reused (the prompt prefix's own cached KV may be).
    blend, usage = response.json()["blend"], response.json()["usage"]
    assert blend["recomputed_tokens"] >= stored["num_tokens"]
    assert sum(blend["reused_tokens"].values()) <= usage["prompt_tokens"] - stored["num_tokens"]
    # Damaged copies were dropped (corrupt, truncated) or forgotten (deleted); the recompute wrote the chunk back.
    wait_until(lambda: ssd.exists() and ssd.read_bytes() != damaged[ssd], "the SSD copy written back", timeout_s=30)
    if damage == "delete":
        assert app.metric_sum("blendserve_kv_events", event="vanished") >= 1
    else:
        assert app.metric_sum("blendserve_kv_events", event="corruptions") >= corruptions_before + 1
        assert app.logs_mention(rf"dropping bad entry {key}")


def test_a_full_ssd_disk_is_skipped_and_written_again_once_space_returns(app: FaultyApp) -> None:
    if not app.mounted:
        pytest.skip("mounting a small tmpfs for the SSD tier needs root")
    filler = app.ssd_root / "filler.bin"
    with open(filler, "wb") as sink:
        try:
            while True:
                sink.write(b"\0" * (1 << 20))
                sink.flush()
        except OSError:  # ENOSPC: the disk is full
            pass
    try:
        docs = documents("disk-full")
        allowed = references(app, docs)
        answered_correctly(app, app.ask(docs, "disk-full"), allowed)
        name, _ = app.shard()
        wait_until(lambda: app.metric("blendserve_kv_events", holder=name, tier="ssd", event="errors") >= 1,
                   "SSD write errors in /metrics", timeout_s=60)
    finally:
        filler.unlink()
    wait_until(lambda: ssd_file_appears(app, app.store(documents(f"disk-{uuid.uuid4().hex[:4]}"), "disk-full")[0]),
               "writes reaching the SSD again")
    assert app.logs_mention(r"kvplane: tier ssd failed")
