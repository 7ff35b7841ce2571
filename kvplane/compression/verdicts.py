"""Which compressions a model's chunk KV may be stored under: verdicts measured once, read by every store."""
import json
import logging
import posixpath
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

import fsspec

from kvplane.keys import fingerprint_tag
from kvplane.tiers.fs import with_timeouts

VERDICT_FOLDER = "compression-verdicts"
VERDICT_TIMEOUT_S = 10.0
RECHECK_S = 30.0  # a missing or refusing verdict is read again after this long

_log = logging.getLogger(__name__)


class CompressionGate(Protocol):
    """Says whether chunk KV of a model may be stored under a compression."""

    def allows(self, fingerprint: str, compression_name: str) -> bool:
        """Whether `compression_name` may be used for chunks of the model `fingerprint`."""


class OpenGate:
    """Allows every compression (a store no measurement guards: libraries, tests)."""

    def allows(self, fingerprint: str, compression_name: str) -> bool:
        return True


class VerdictBook:
    """Verdicts as JSON under `<url>/<fingerprint tag>/<compression>.json`: one read for every worker and shard."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        protocol = url.split("://", 1)[0]
        options = with_timeouts(protocol, {"use_listings_cache": False, **(storage_options or {})}, VERDICT_TIMEOUT_S)
        self.url = url
        self.storage_options = dict(storage_options or {})
        self._fs, self._root = fsspec.core.url_to_fs(url, **options)

    def get(self, fingerprint: str, compression_name: str) -> dict[str, Any] | None:
        """The recorded verdict (a JSON object with at least `passed`), or None."""
        try:
            return json.loads(self._fs.cat_file(self._path(fingerprint, compression_name)))
        except FileNotFoundError:
            return None

    def put(self, fingerprint: str, compression_name: str, verdict: Mapping[str, Any]) -> None:
        """Record a verdict (it must say whether it `passed`)."""
        if not isinstance(verdict.get("passed"), bool):
            raise ValueError("a verdict must say whether it passed (a bool under 'passed')")
        path = self._path(fingerprint, compression_name)
        self._fs.makedirs(posixpath.dirname(path), exist_ok=True)
        self._fs.pipe_file(path, json.dumps(dict(verdict)).encode())

    def _path(self, fingerprint: str, compression_name: str) -> str:
        return posixpath.join(self._root, fingerprint_tag(fingerprint), f"{compression_name}.json")


class VerdictGate:
    """Allows a compression once its recorded verdict passed; until then (no verdict, or a refusal) it does not."""

    # A pass is kept for good; an absent or refusing verdict is read again after `recheck_s`, so a verdict
    # recorded later by a worker (or by an operator, after raising the bound) takes effect without restarts.

    def __init__(self, book: VerdictBook, recheck_s: float = RECHECK_S) -> None:
        self._book = book
        self._recheck_s = recheck_s
        self._known: dict[tuple[str, str], tuple[bool, float]] = {}
        self._lock = threading.Lock()

    def allows(self, fingerprint: str, compression_name: str) -> bool:
        entry = (fingerprint, compression_name)
        with self._lock:
            known = self._known.get(entry)
        if known is not None and (known[0] or time.monotonic() - known[1] < self._recheck_s):
            return known[0]
        try:
            verdict = self._book.get(fingerprint, compression_name)
        except OSError as err:  # the book is unreachable: store uncompressed, ask again later
            _log.warning("kvplane: compression verdicts at %s unreadable (%s): storing uncompressed",
                         self._book.url, err)
            verdict = None
        passed = bool(verdict and verdict.get("passed"))
        if verdict is not None and not passed and known is None:
            _log.error("kvplane: compression %s refused for model %s by its recorded verdict (%s): storing "
                       "uncompressed", compression_name, fingerprint, verdict)
        with self._lock:
            self._known[entry] = (passed, time.monotonic())
        return passed
