"""`blendserve fetch-model`: a checkpoint directory copied from S3 (a real moto server) or a folder, once."""
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem
from typer.testing import CliRunner

from cluster.cli import app
from kvplane.tiers.local_s3 import LocalS3, create_bucket, s3_storage_options
from workers.model import fetch as model_fetch
from workers.model.fetch import MARKER_NAME, FetchError, fetch_model

BUCKET = "models"
# A checkpoint's usual files, plus one in a subfolder (as Llama repositories ship original/params.json).
CHECKPOINT = {
    "config.json": json.dumps({"model_type": "llama", "hidden_size": 64}).encode(),
    "model.safetensors": os.urandom(96 << 10),
    "tokenizer.json": b'{"version": "1.0"}',
    "tokenizer_config.json": b'{"model_max_length": 2048}',
    "generation_config.json": b'{"do_sample": false}',
    "original/params.json": b'{"dim": 64}',
}


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on loopback with the `models` bucket."""
    with LocalS3() as endpoint_url:
        create_bucket(endpoint_url, BUCKET)
        yield endpoint_url


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials as the chart's init container gets them: AWS_* variables, nothing on disk."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)


def upload(endpoint_url: str, prefix: str, files: dict[str, bytes]) -> str:
    """Put `files` under s3://models/<prefix>/ and return that URL."""
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3_storage_options(endpoint_url))
    for name, data in files.items():
        fs.pipe_file(f"{BUCKET}/{prefix}/{name}", data)
    return f"s3://{BUCKET}/{prefix}"


def write_folder(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` but the marker, by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and p.name != MARKER_NAME}


def fetch_command(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["fetch-model", *args])
    return result.exit_code, result.stdout, result.stderr


def test_the_command_copies_an_s3_checkpoint_then_a_rerun_copies_nothing(s3_endpoint, aws_env, tmp_path):
    source = upload(s3_endpoint, "smol", CHECKPOINT)
    dest = tmp_path / "models" / "smol"
    code, out, err = fetch_command(source, str(dest), "--endpoint-url", s3_endpoint, "--region", "eu-west-1")
    assert (code, out.strip()) == (0, str(dest)), err
    assert tree(dest) == CHECKPOINT
    marker = json.loads((dest / MARKER_NAME).read_text())
    assert marker == {"source": source, "sizes": {name: len(data) for name, data in sorted(CHECKPOINT.items())}}
    assert sorted(p.name for p in dest.parent.iterdir()) == ["smol"]  # no staging sibling left behind
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in dest.rglob("*")}
    code, out, err = fetch_command(source, str(dest), "--endpoint-url", s3_endpoint)
    assert (code, out.strip()) == (0, str(dest)), err
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in dest.rglob("*")} == before  # not one file rewritten


def test_a_source_changed_since_the_fetch_is_fetched_again(s3_endpoint, aws_env, tmp_path):
    source = upload(s3_endpoint, "changing", CHECKPOINT)
    dest = tmp_path / "changing"
    assert not fetch_model(source, dest, s3_endpoint).skipped
    retrained = {**CHECKPOINT, "model.safetensors": os.urandom(80 << 10)}
    upload(s3_endpoint, "changing", retrained)
    assert not fetch_model(source, dest, s3_endpoint).skipped
    assert tree(dest) == retrained


def _no_marker(dest: Path) -> None:
    (dest / MARKER_NAME).unlink()
    with (dest / "model.safetensors").open("r+b") as weights:  # a copy cut short
        weights.truncate(1000)


def _truncated_after(dest: Path) -> None:
    with (dest / "model.safetensors").open("r+b") as weights:
        weights.truncate(1000)


def _file_deleted(dest: Path) -> None:
    (dest / "tokenizer.json").unlink()


def _other_source(dest: Path) -> None:
    marker = json.loads((dest / MARKER_NAME).read_text())
    (dest / MARKER_NAME).write_text(json.dumps({**marker, "source": "s3://models/another"}))


@pytest.mark.parametrize("damage", [_no_marker, _truncated_after, _file_deleted, _other_source],
                         ids=["partial-copy-without-marker", "file-truncated", "file-deleted", "marker-of-another"])
def test_an_incomplete_dest_is_fetched_again(s3_endpoint, aws_env, tmp_path, damage):
    source = upload(s3_endpoint, "damaged", CHECKPOINT)
    dest = tmp_path / "damaged"
    fetch_model(source, dest, s3_endpoint)
    damage(dest)
    (dest / "stray.bin").write_bytes(b"left over")
    result = fetch_model(source, dest, s3_endpoint)
    assert not result.skipped
    assert tree(dest) == CHECKPOINT  # the stray file went with the rest of the old copy
    assert fetch_model(source, dest, s3_endpoint).skipped


def test_a_source_without_config_json_fails_clearly_and_leaves_dest_alone(s3_endpoint, aws_env, tmp_path):
    weights_only = {name: data for name, data in CHECKPOINT.items() if name != "config.json"}
    source = upload(s3_endpoint, "weights-only", weights_only)
    dest = tmp_path / "weights-only"
    code, out, err = fetch_command(source, str(dest), "--endpoint-url", s3_endpoint)
    assert code == 1
    assert f"{source} has no config.json, so it is not a model checkpoint directory" in err
    code, out, err = fetch_command(f"s3://{BUCKET}/no-such-prefix", str(dest), "--endpoint-url", s3_endpoint)
    assert code == 1
    assert "has no config.json: nothing is there" in err
    assert not dest.exists()


def test_a_local_folder_is_fetched_by_path_and_by_file_url(tmp_path):
    source = write_folder(tmp_path / "checkpoint", CHECKPOINT)
    dest = tmp_path / "copy"
    code, out, err = fetch_command(str(source), str(dest))
    assert (code, out.strip()) == (0, str(dest)), err
    assert tree(dest) == CHECKPOINT
    assert fetch_model(f"file://{source}/", dest).skipped  # the same folder, named as a URL
    code, out, err = fetch_command(str(source), str(dest), "--endpoint-url", "http://127.0.0.1:9000")
    assert code == 1
    assert "--endpoint-url and --region apply to s3:// sources only" in err


def test_a_mount_point_dest_is_filled_in_place(tmp_path, monkeypatch):
    # A Kubernetes volume mounted at DEST cannot be renamed over: the copy is staged inside it and moved up.
    source = write_folder(tmp_path / "checkpoint", CHECKPOINT)
    dest = write_folder(tmp_path / "volume", {"config.json": b"{}", "old/model-00001-of-00002.safetensors": b"x",
                                              "lost+found/#12": b"ext4's"})
    real_ismount = os.path.ismount
    monkeypatch.setattr(model_fetch.os.path, "ismount", lambda path: Path(path) == dest or real_ismount(path))
    result = fetch_model(str(source), dest)
    assert not result.skipped
    assert tree(dest) == {**CHECKPOINT, "lost+found/#12": b"ext4's"}  # the filesystem's own folder stays
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "volume"]  # nothing written beside it
    assert sorted(p.name for p in dest.iterdir() if p.name.startswith(".")) == [MARKER_NAME]
    assert fetch_model(str(source), dest).skipped


def test_a_failed_copy_leaves_no_marker_and_no_staging(tmp_path, monkeypatch):
    source = write_folder(tmp_path / "checkpoint", CHECKPOINT)
    dest = tmp_path / "copy"

    def cut_short(self, rpaths: list[str], lpaths: list[str]) -> None:
        shutil.copyfile(rpaths[0], lpaths[0])
        raise OSError("connection reset")

    monkeypatch.setattr(LocalFileSystem, "get", cut_short)
    with pytest.raises(FetchError, match="connection reset"):
        fetch_model(str(source), dest)
    assert list(tmp_path.iterdir()) == [tmp_path / "checkpoint"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a bind mount needs root")
def test_a_bind_mount_on_the_same_device_counts_as_a_mount_point(tmp_path):
    # A volume the kubelet bind-mounts may share its device with the parent folder: os.path.ismount misses it.
    volume, dest = tmp_path / "volume", tmp_path / "models" / "checkpoint"
    volume.mkdir()
    dest.mkdir(parents=True)
    check = ("from pathlib import Path; from workers.model.fetch import is_mount_point; "
             f"print(is_mount_point(Path({str(dest)!r})))")
    script = f"mount --bind {volume} {dest} && {sys.executable} -c {shlex.quote(check)}"
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3], timeout=60)
    assert done.stdout.split() == ["True"], done.stderr
    assert not model_fetch.is_mount_point(dest)  # not mounted out here
