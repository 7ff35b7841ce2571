"""Membership: heartbeats keep a worker listed; silence past the timeout drops it."""
import pytest

from scheduler.membership import Membership, WorkerReport


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_members_expire_without_heartbeats_and_return_when_heard_again():
    clock = Clock()
    membership = Membership(timeout_s=5.0, now_s=clock)
    membership.heartbeat("w2", "node-a", "fp", WorkerReport(evictions={"device": 3}))
    membership.heartbeat("w1", "node-a", "fp", WorkerReport())
    assert [m.worker_id for m in membership.members()] == ["w1", "w2"]
    clock.now_s += 4.0
    membership.heartbeat("w1", "node-a", "fp", WorkerReport())
    clock.now_s += 2.0
    assert [m.worker_id for m in membership.members()] == ["w1"]
    membership.heartbeat("w2", "node-b", "fp", WorkerReport())
    assert {m.worker_id: m.node_id for m in membership.members()} == {"w1": "node-a", "w2": "node-b"}
    assert membership.members()[1].report == WorkerReport()
    membership.leave("w1")
    assert [m.worker_id for m in membership.members()] == ["w2"]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="timeout_s"):
        Membership(timeout_s=0)
    with pytest.raises(ValueError, match="worker_id"):
        Membership().heartbeat("", "node", "fp", WorkerReport())


def test_auto_dtype_is_settled_once_per_model_and_relearned_from_running_workers():
    membership = Membership()
    assert membership.settle_dtype("smol", "bfloat16") == "bfloat16"
    assert membership.settle_dtype("smol", "float32") == "bfloat16"  # a later worker of another CPU kind follows
    assert membership.settle_dtype("gemma", "float32") == "float32"
    restarted = Membership()  # the actor restarted empty: the heartbeats tell what the model runs in
    restarted.heartbeat("w1", "node-a", "fp", WorkerReport(dtype="float32", model="gemma"))
    restarted.heartbeat("w2", "node-a", "fp", WorkerReport(dtype="bfloat16", model="smol"))
    assert restarted.settle_dtype("smol", "float32") == "bfloat16"
    assert restarted.settle_dtype("other", "float32") == "float32"
    with pytest.raises(ValueError, match="proposed"):
        restarted.settle_dtype("smol", "")
