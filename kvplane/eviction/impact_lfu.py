"""Impact-aware W-TinyLFU: a chunk's worth is how often it is read times how much of it a read can reuse.

Cache-Craft (Agarwal et al., SIGMOD'25) keeps chunks by reuse and by their Cache Context Impact: a chunk that
the context reaches strongly must be recomputed heavily wherever it is used, so keeping it saves little. This
policy is TinyLFU with the score of a key multiplied by its worth, 1 - impact_weight x impact (at least
`floor`), once the chunk's impact is known (workers/chunks/impact.py tells it through note_impact); a chunk
whose impact is unknown is worth 1, as under plain TinyLFU.
"""
from collections import OrderedDict

from kvplane.checks import check, check_non_negative
from kvplane.eviction.tinylfu import TinyLFUPolicy

MIN_REMEMBERED = 4096  # impacts remembered for keys, at least; more while more keys are resident


class ImpactTinyLFUPolicy(TinyLFUPolicy):
    """W-TinyLFU whose admission and eviction weigh estimated frequency x priority x worth(impact)."""

    def __init__(self, capacity_bytes: int, impact_weight: float = 0.9, floor: float = 0.1, **tinylfu: float) -> None:
        super().__init__(capacity_bytes, **tinylfu)
        check_non_negative("impact_weight", impact_weight)
        check(0.0 < floor <= 1.0, "floor", "in (0, 1]", floor)
        self.impact_weight = impact_weight
        self.floor = floor
        self._impacts: OrderedDict[str, float] = OrderedDict()  # also for keys not (yet) resident

    def note_impact(self, key: str, impact: float) -> None:
        """The chunk's context impact in [0, 1] (a running mean over its uses), for its next comparisons."""
        check(0.0 <= impact <= 1.0, "impact", "in [0, 1]", impact)
        self._impacts.pop(key, None)
        self._impacts[key] = impact
        while len(self._impacts) > max(MIN_REMEMBERED, 4 * len(self._priorities)):
            self._impacts.popitem(last=False)

    def worth(self, key: str) -> float:
        """The share of a read's compute that keeping the chunk saves, as far as its impact tells."""
        impact = self._impacts.get(key)
        return 1.0 if impact is None else max(self.floor, 1.0 - self.impact_weight * impact)

    def _score(self, key: str) -> float:
        return super()._score(key) * self.worth(key)
