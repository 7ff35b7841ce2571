"""The deployment's compression verdicts: where they are kept, and measuring those still missing at worker start."""
import logging

from cluster.config import ServeConfig
from kvplane.compression.registry import NONE
from kvplane.compression.verdicts import VERDICT_FOLDER, VerdictBook
from workers.fuser import Fuser
from workers.guardrails.compression_gate import DEFAULT_MAX_KL_INCREASE, measure_compression

_log = logging.getLogger(__name__)


def verdict_book(config: ServeConfig) -> VerdictBook:
    """In the object tier when configured (every node reads it), else under the data folder."""
    return VerdictBook(*config.shared_folder(VERDICT_FOLDER))


def configured_compressions(config: ServeConfig) -> list[str]:
    """The compressions the configured tiers use, each once."""
    return sorted({tier.compression for tier in config.tiers or () if tier.compression != NONE})


def record_missing_verdicts(config: ServeConfig, fuser: Fuser, book: VerdictBook) -> dict[str, bool]:
    """Measure each configured compression on `fuser`'s model unless a verdict is recorded; whether each passed."""
    fingerprint = fuser.runner.checkpoint.fingerprint
    passed = {}
    for name in configured_compressions(config):
        try:
            found = book.get(fingerprint, name)
            if found is None:
                bound = config.guardrails.compression_max_kl_increase
                bound = DEFAULT_MAX_KL_INCREASE.get(name, 0.0) if bound is None else bound
                found = measure_compression(fuser, name, bound).as_record()
                book.put(fingerprint, name, found)
        except OSError as err:  # the book unreachable: the stores stay uncompressed, the next start tries again
            _log.warning("blendserve: compression verdicts at %s unreachable (%s): %s stays off", book.url, err, name)
            passed[name] = False
            continue
        passed[name] = bool(found["passed"])
        if passed[name]:
            _log.info("blendserve: compression %s allowed for model %s: %s", name, fingerprint, found)
        else:
            _log.error("blendserve: compression %s refused for model %s, chunk KV stays uncompressed: teacher-forced "
                       "KL +%.4f > %.4f (%s)", name, fingerprint, found.get("kl_increase", float("nan")),
                       found.get("max_kl_increase", float("nan")), found)
    return passed
