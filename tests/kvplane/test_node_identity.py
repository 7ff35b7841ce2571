"""The SSD slot of a pod on Kubernetes: named by its node, claimed again by the next pod there, one budget per node."""
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvplane.codec import encode
from kvplane.node_identity import claim_slot
from kvplane.ray import shard
from kvplane.ray.shard import ShardConfig, ShardServer
from kvplane.store import TieredStore
from kvplane.tiers.fs import TEMPORARY_MARK
from kvplane.tiers.spec import TierSpec
from tests.kvplane.conftest import build_entry

NODE_ENV = "BLENDSERVE_NODE_NAME"  # the Helm chart sets it in every Ray container from spec.nodeName
MAX_FOLDER_NAME_BYTES = 255  # ext4, xfs
# Stands for another pod's live shard: holds a slot's lock until its stdin closes.
HOLD_LOCK = "import fcntl, sys; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); "
HOLD_LOCK += "sys.stdin.read()"

Become = Callable[[str, str | None], None]


@pytest.fixture
def become(monkeypatch: pytest.MonkeyPatch) -> Become:
    """Makes this process look like pod `pod` (its host name) on node `node` (None: the variable unset)."""

    def on(pod: str, node: str | None) -> None:
        monkeypatch.setattr(socket, "gethostname", lambda: pod)
        if node is None:
            monkeypatch.delenv(NODE_ENV, raising=False)
        else:
            monkeypatch.setenv(NODE_ENV, node)

    return on


@pytest.fixture
def servers() -> Iterator[list[ShardServer]]:
    """Shards made by a test, closed (slot released) after it."""
    made: list[ShardServer] = []
    yield made
    for server in made:
        server.close()


def ssd_config(root: Path, budget_bytes: int) -> ShardConfig:
    return ShardConfig(ram_capacity_bytes=0, ssd_url=f"file://{root}", ssd_capacity_bytes=budget_bytes, policy="lru")


def folder_bytes(folder: Path) -> int:
    """Bytes of the entries under a slot folder (temporaries of writes in flight left out)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and TEMPORARY_MARK not in p.name)


def fill(server: ShardServer, seeds: range) -> None:
    for seed in seeds:
        entry = build_entry(seed)
        server.put(entry.key, encode(entry).numpy())
    server.flush()


def test_the_node_name_names_the_slot_and_the_host_name_does_without_it(tmp_path: Path, become: Become) -> None:
    for node, expected in [("gke-pool-a-1f2e", "gke-pool-a-1f2e"), ("", "blendserve-worker-7c4d9"),
                           (None, "blendserve-worker-7c4d9")]:
        become("blendserve-worker-7c4d9", node)
        slot = claim_slot(tmp_path)
        assert slot.name == expected, f"{NODE_ENV}={node!r}"
        slot.release()


def test_a_replacement_pod_on_the_node_claims_its_slot_and_finds_its_entries(
    tmp_path: Path, become: Become, servers: list[ShardServer]
) -> None:
    become("blendserve-worker-abcde", "node-a")
    first = claim_slot(tmp_path)
    entries = [build_entry(seed) for seed in range(5)]
    with TieredStore.from_specs([TierSpec("ssd", f"file://{tmp_path / first.name}", 1 << 20, "lru")]) as store:
        for entry in entries:
            store.put(entry)
    first.release()  # the pod is gone: the OS drops the lock of a process that dies
    become("blendserve-worker-fghij", "node-a")  # KubeRay's replacement pod: a new host name, the same node
    servers.append(server := ShardServer(ssd_config(tmp_path, 1 << 20), "ray-node-2"))
    assert server.identity == first.name == "node-a"
    assert server.recovered == len(entries)
    assert all(server.locate(entry.key) == "ssd" for entry in entries)


def test_live_pods_on_one_node_share_its_ssd_budget(tmp_path: Path, become: Become, servers: list[ShardServer]) -> None:
    budget_bytes = 40 * encode(build_entry(0)).numel()
    become("blendserve-worker-abcde", "node-a")
    servers.append(first := ShardServer(ssd_config(tmp_path, budget_bytes), "ray-node-1"))
    fill(first, range(100))
    alone_bytes = folder_bytes(tmp_path / first.identity)
    assert budget_bytes // 2 < alone_bytes <= budget_bytes  # alone on the node, it has the whole budget
    become("blendserve-worker-fghij", "node-a")
    servers.append(second := ShardServer(ssd_config(tmp_path, budget_bytes), "ray-node-2"))
    fill(second, range(100, 200))
    assert 0 < folder_bytes(tmp_path / second.identity) <= budget_bytes // 2
    assert first.refresh_share() == second.refresh_share() == budget_bytes // 2
    first.flush()
    first_bytes, second_bytes = folder_bytes(tmp_path / first.identity), folder_bytes(tmp_path / second.identity)
    assert 0 < first_bytes <= budget_bytes // 2 and first_bytes + second_bytes <= budget_bytes
    fill(first, range(200, 260))  # still bounded by its share while the other pod lives
    assert folder_bytes(tmp_path / first.identity) <= budget_bytes // 2
    first.close()  # the first pod goes: the other one gets the node's whole budget back
    assert second.refresh_share() == budget_bytes
    fill(second, range(300, 400))
    assert budget_bytes // 2 < folder_bytes(tmp_path / second.identity) <= budget_bytes


def test_a_pods_share_falls_by_itself_when_another_pod_comes_to_the_node(
    tmp_path: Path, become: Become, servers: list[ShardServer]
) -> None:
    budget_bytes = 40 * encode(build_entry(0)).numel()
    become("blendserve-worker-abcde", "node-a")
    servers.append(first := ShardServer(ssd_config(tmp_path, budget_bytes), "ray-node-1"))
    fill(first, range(100))
    watch = shard.ShareWatch(first, interval_s=0.05).start()  # what the shard runs every SHARE_REFRESH_S
    try:
        servers.append(ShardServer(ssd_config(tmp_path, budget_bytes), "ray-node-2"))
        deadline_s = time.monotonic() + 30
        while folder_bytes(tmp_path / first.identity) > budget_bytes // 2 and time.monotonic() < deadline_s:
            time.sleep(0.05)
            first.flush()
        assert 0 < folder_bytes(tmp_path / first.identity) <= budget_bytes // 2
    finally:
        watch.stop()


def test_a_claim_sweeps_the_slots_of_dead_pods_and_keeps_those_of_live_ones(tmp_path: Path, become: Become) -> None:
    for name in ("node-a", "blendserve-worker-old", "live-pod", "dead-pod"):
        (tmp_path / name / "ab").mkdir(parents=True)
        (tmp_path / name / "ab" / "entry").write_bytes(b"kv" * 100)
        (tmp_path / f".{name}.lock").touch()
    (tmp_path / ".never-wrote.lock").touch()  # a pod that died before writing anything
    (tmp_path / "lost+found").mkdir()  # no lock file: not a slot, never touched
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path / ".live-pod.lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        become("node-a", None)  # named by its host, as before: the sweep does not depend on the node name
        slot = claim_slot(tmp_path)
        assert slot.name == "node-a"
        entries = sorted(p.name for p in tmp_path.iterdir())
        assert entries == [".live-pod.lock", ".node-a.lock", ".slots.mutex", "live-pod", "lost+found", "node-a"]
        assert (tmp_path / "live-pod" / "ab" / "entry").read_bytes() == b"kv" * 100
        assert (tmp_path / "node-a" / "ab" / "entry").read_bytes() == b"kv" * 100  # its own, found again
    finally:
        holder.communicate("", timeout=30)


def test_a_node_name_with_unsafe_characters_is_made_safe(tmp_path: Path, become: Become) -> None:
    long_names = ["n" * 252 + "a", "n" * 252 + "b"]  # Kubernetes allows 253 characters
    names = []
    for raw in ["Node/A b:c", "..", "../../etc", ".hidden", *long_names]:
        become("blendserve-worker-7c4d9", raw)
        slot = claim_slot(tmp_path)
        names.append(slot.name)
        assert slot.name and set(slot.name) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
        assert not slot.name.startswith("."), raw  # neither `.`, `..` nor a hidden name
        assert len(f".{slot.name}-63.lock".encode()) <= MAX_FOLDER_NAME_BYTES, raw
        slot.release()
    assert names[0] == "Node_A_b_c"
    assert names[2] != "etc" and "/" not in names[2]
    assert names[-1] != names[-2]  # two long names that differ only at the end keep apart
