"""Verdicts at worker start: recorded ones are read, not measured again; an unreachable book leaves compression off."""
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from cluster.compression_verdicts import configured_compressions, record_missing_verdicts, verdict_book
from cluster.config import config_from_dict
from kvplane.compression.verdicts import VerdictBook

FINGERPRINT = "model-under-test"


def _config(data_dir: Path) -> object:
    tiers = [
        {"name": "device", "url": "device://", "capacity_bytes": 1 << 20, "compression": "int8"},
        {"name": "ram", "url": "ram://", "capacity_bytes": 1 << 20, "compression": "int4"},
        {"name": "ssd", "url": f"file://{data_dir / 'kv'}", "capacity_bytes": 1 << 20, "compression": "int8"},
    ]
    return config_from_dict({"data_dir": str(data_dir), "tiers": tiers})


def _fuser() -> object:
    # Only its model's fingerprint is read while every verdict is recorded (a measurement would need the model).
    return SimpleNamespace(runner=SimpleNamespace(checkpoint=SimpleNamespace(fingerprint=FINGERPRINT)))


def test_recorded_verdicts_are_read_and_the_book_lives_in_the_data_folder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(tmp_path)
    assert configured_compressions(config) == ["int4", "int8"]
    book = verdict_book(config)
    assert book.url == f"file://{tmp_path / 'compression-verdicts'}"
    book.put(FINGERPRINT, "int8", {"passed": True})
    book.put(FINGERPRINT, "int4", {"passed": False, "kl_increase": 0.03, "max_kl_increase": 0.02})
    with caplog.at_level(logging.INFO, logger="cluster.compression_verdicts"):
        assert record_missing_verdicts(config, _fuser(), book) == {"int4": False, "int8": True}
    errors = [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR]
    assert len(errors) == 1  # the refusal is loud; the allowed compression is not an error
    assert "compression int4 refused" in errors[0] and FINGERPRINT in errors[0]
    assert "KL +0.0300 > 0.0200" in errors[0]


def test_an_unreachable_book_leaves_every_compression_off(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    book = VerdictBook(f"file://{blocker / 'verdicts'}")
    assert record_missing_verdicts(_config(tmp_path), _fuser(), book) == {"int4": False, "int8": False}
