"""A throwaway S3 endpoint (moto server on loopback) for tests and the store benchmark."""
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import fsspec

_CREDENTIALS = {"key": "testing", "secret": "testing"}


def s3_storage_options(endpoint_url: str) -> dict[str, Any]:
    """fsspec/s3fs options that point at `endpoint_url` with dummy credentials."""
    return {**_CREDENTIALS, "client_kwargs": {"endpoint_url": endpoint_url}}


def create_bucket(endpoint_url: str, bucket: str) -> None:
    """Create `bucket` if it does not exist (`kv` is too short for S3; `kvcache` works)."""
    fs = fsspec.filesystem("s3", **s3_storage_options(endpoint_url))
    if not fs.exists(bucket):
        fs.mkdir(bucket)


class LocalS3:
    """`with LocalS3() as endpoint_url:` runs `moto_server -H HOST -p PORT` for the block's duration."""

    # `host` is loopback unless a test's own network namespaces must reach it (their node's bridge address).
    def __init__(self, startup_timeout_s: float = 30.0, port: int | None = None, host: str = "127.0.0.1") -> None:
        self._startup_timeout_s = startup_timeout_s
        self.host = host
        self._process: subprocess.Popen[bytes] | None = None
        self.port = port  # a given port lets a test bring an endpoint back where clients expect it

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (tests stop, continue and kill it)."""
        return None if self._process is None else self._process.pid

    def __enter__(self) -> str:
        port = self.port = self.port or _free_port()
        self._process = subprocess.Popen(
            [_moto_server(), "-H", self.host, "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + self._startup_timeout_s
        while not _accepts(self.host, port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"moto_server did not start on port {port}")
            time.sleep(0.05)
        return f"http://{self.host}:{port}"

    def __exit__(self, *_exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None


def _moto_server() -> str:
    beside_python = Path(sys.executable).with_name("moto_server")
    found = str(beside_python) if beside_python.exists() else shutil.which("moto_server")
    if found is None:
        raise RuntimeError("moto_server not found; install moto[server]")
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _accepts(host: str, port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((host, port)) == 0
