"""`blendserve serve` as a process: it refuses an open API on a reachable address, and SIGTERM drains it."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from cluster.cli import app
from tests.local_ray import free_port

READY_TIMEOUT_S = 240
DRAIN_TIMEOUT_S = 120


def test_serve_refuses_an_open_api_on_a_reachable_address(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({"server": {"host": "0.0.0.0"}}))
    result = CliRunner().invoke(app, ["serve", "--config", str(config)])
    said = " ".join(result.output.replace("│", " ").split())  # typer boxes and wraps the message
    assert result.exit_code == 2
    assert "'0.0.0.0' is reachable from other machines and no API key is configured" in said
    assert "allow_unauthenticated: true" in said


@pytest.mark.slow
def test_sigterm_drains_a_running_stream_and_exits_cleanly(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("sg")
    port = free_port()
    config = root / "serve.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(root / "data"),
        "engine": {"kind": "torch", "num_threads": 1},
        "guardrails": {"canary": False},
        "workers": {"num_replicas": 1, "num_cpus": 1},
        "prompt": {"instruction": "", "question_template": "{question}", "use_chat_template": False},
        "server": {"port": port},
    }))
    # Ray's files, sockets and its current-cluster marker stay in this test's folder, all on loopback.
    env = {**os.environ, "RAY_TMPDIR": str(root / "ray"), "TMPDIR": str(root), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    log = root / "serve.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("blendserve")), "serve", "--config", str(config)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline_s = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline_s:
            try:
                if httpx.get(f"{base_url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, log.read_text()[-3000:]
            time.sleep(1)
        else:
            raise TimeoutError(f"blendserve serve was not ready within {READY_TIMEOUT_S} s")

        lines: list[str] = []
        started = threading.Event()

        def stream() -> None:
            body = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9,", "max_tokens": 48, "stream": True}
            with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=DRAIN_TIMEOUT_S) as response:
                for line in response.iter_lines():
                    lines.append(line)
                    started.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert started.wait(120)
        process.send_signal(signal.SIGTERM)
        reader.join(DRAIN_TIMEOUT_S)
        assert process.wait(DRAIN_TIMEOUT_S) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and not any('"error"' in event for event in events)
    finished = json.loads(events[-2].removeprefix("data: "))
    assert finished["choices"][0]["finish_reason"] == "length"  # the whole answer, not one cut short
    output = log.read_text()
    assert "SIGTERM received; draining" in output and "drained and stopped" in output
    assert "Traceback" not in output
