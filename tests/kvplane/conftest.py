"""Shared kvplane fixtures: chunk entries, a real S3 endpoint (moto), a real two-node Ray cluster."""
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from kvplane.entry import KVEntry
from kvplane.keys import chunk_key
from kvplane.tiers.local_s3 import LocalS3, create_bucket, s3_storage_options
from kvplane.tiers.spec import TierSpec

FINGERPRINT = "smollm2-135m/test-fingerprint"
BUCKET = "kvcache"
EntryFactory = Callable[..., KVEntry]


def build_entry(
    seed: int,
    num_tokens: int = 8,
    num_layers: int = 3,
    dtype: torch.dtype = torch.float32,
    fingerprint: str = FINGERPRINT,
) -> KVEntry:
    """A small random chunk entry whose content (and key) is fixed by `seed`."""
    generator = torch.Generator().manual_seed(seed)
    token_ids = torch.randint(0, 49152, (num_tokens,), generator=generator).tolist()
    kv = torch.randn(num_layers, 2, num_tokens, 3, 8, generator=generator).to(dtype)
    return KVEntry(chunk_key(fingerprint, "tenant-a", token_ids), kv, token_ids, fingerprint)


@pytest.fixture
def make_entry() -> EntryFactory:
    """Builds a small random chunk entry whose content (and key) is fixed by `seed`."""
    return build_entry


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


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """Two Ray nodes on loopback (one CPU each), with Ray's files in a test-owned folder."""
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("ray")
    node_args = {"num_cpus": 1, "object_store_memory": 100 * 1024 * 1024}
    with pytest.MonkeyPatch.context() as patch:
        # The switch keeps every Ray address on loopback. Ray reads it at import, which has already
        # happened in this process, so the parsed constant is set too; child processes read the env.
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        patch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        patch.setenv("TMPDIR", str(root))
        cluster = Cluster(initialize_head=True, head_node_args={**node_args, "temp_dir": str(root / "ray")})
        try:
            cluster.add_node(**node_args)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, namespace="kvplane-tests")
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()


@pytest.fixture
def ssd_url(tmp_path: Path) -> str:
    """A file:// URL for an SSD tier in this test's folder."""
    return f"file://{tmp_path / 'ssd'}"
