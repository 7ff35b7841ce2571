"""Ray and Serve of this machine alone for a test: loopback only, their files under the test's folder."""
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def local_ray(root: Path, num_cpus: int, object_store_bytes: int, env: dict[str, str] | None = None) -> Iterator[None]:
    """A one-node Ray on loopback with its files under `root` (a short path); stopped on the way out."""
    import ray
    from ray._private import ray_constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        patch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        patch.setenv("TMPDIR", str(root))
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=str(root / "ray"),
                 object_store_memory=object_store_bytes)
        try:
            yield
        finally:
            ray.shutdown()


@contextmanager
def local_serve(root: Path, num_cpus: int, object_store_bytes: int, http_port: int,
                env: dict[str, str] | None = None) -> Iterator[None]:
    """A one-node Ray on loopback with Serve's proxy on `http_port`; everything stopped on the way out."""
    from ray import serve

    with local_ray(root, num_cpus, object_store_bytes, env):
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": http_port})
            yield
        finally:
            serve.shutdown()
