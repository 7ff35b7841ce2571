"""Shared kvplane fixtures: chunk entries, a real S3 endpoint (moto), a real two-node Ray cluster."""
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from kvplane.entry import KVEntry
from kvplane.keys import chunk_key
from kvplane.local_s3 import LocalS3, create_bucket, s3_storage_options
from kvplane.tier_spec import TierSpec

FINGERPRINT = "smollm2-135m/test-fingerprint"
BUCKET = "kvcache"
EntryFactory = Callable[..., KVEntry]


@pytest.fixture
def make_entry() -> EntryFactory:
    """Builds a small random chunk entry whose content (and key) is fixed by `seed`."""

    def build(
        seed: int,
        num_tokens: int = 8,
        num_layers: int = 3,
        dtype: torch.dtype = torch.float32,
        fingerprint: str = FINGERPRINT,
    ) -> KVEntry:
        generator = torch.Generator().manual_seed(seed)
        token_ids = torch.randint(0, 49152, (num_tokens,), generator=generator).tolist()
        kv = torch.randn(num_layers, 2, num_tokens, 3, 8, generator=generator).to(dtype)
        return KVEntry(chunk_key(fingerprint, "tenant-a", token_ids), kv, token_ids, fingerprint)

    return build


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on loopback with the `kvcache` bucket, for the whole session."""
    with LocalS3() as endpoint_url:
        create_bucket(endpoint_url, BUCKET)
        yield endpoint_url


@pytest.fixture
def s3_spec(s3_endpoint: str) -> TierSpec:
    """An S3 tier spec under a fresh prefix of the session bucket."""
    return TierSpec("s3", f"s3://{BUCKET}/{uuid.uuid4().hex}", 1 << 30, "lru", s3_storage_options(s3_endpoint))


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """Two Ray nodes on loopback (one CPU each), with Ray's files in a test-owned folder."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("ray")
    saved = {name: os.environ.get(name) for name in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "TMPDIR")}
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["TMPDIR"] = str(root)
    node_args = {"num_cpus": 1, "object_store_memory": 100 * 1024 * 1024}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "_temp_dir": str(root)})
    cluster.add_node(**node_args)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="kvplane-tests")
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def ssd_url(tmp_path: Path) -> str:
    """A file:// URL for an SSD tier in this test's folder."""
    return f"file://{tmp_path / 'ssd'}"
