"""The registry of fusion modes: a name chosen once per engine maps to one strategy object."""
from workers.fusion.base import FusionMode, FusionOptions
from workers.fusion.baselines.epic import Epic
from workers.fusion.baselines.full_prefill import FullPrefill
from workers.fusion.baselines.full_reuse import FullReuse
from workers.fusion.baselines.prefix_cache import PrefixCache
from workers.fusion.boundary_blend import BoundaryBlend
from workers.fusion.cacheblend import CacheBlend
from workers.fusion.cachecraft import CacheCraft
from workers.fusion.query_boundary import QueryBoundary
from workers.fusion.query_driven import QueryDriven

FUSION_MODES: dict[str, type[FusionMode]] = {
    mode.name: mode
    for mode in (FullPrefill, PrefixCache, FullReuse, Epic, CacheBlend, BoundaryBlend, CacheCraft, QueryDriven,
                 QueryBoundary)
}


def make_fusion_modes(options: FusionOptions, names: list[str] | None = None) -> dict[str, FusionMode]:
    """Instantiate the named modes (all by default); unknown names are refused with the valid ones listed."""
    names = list(FUSION_MODES) if names is None else names
    unknown = [n for n in names if n not in FUSION_MODES]
    if unknown:
        raise ValueError(f"unknown fusion mode(s) {unknown}; choose from {sorted(FUSION_MODES)}")
    return {n: FUSION_MODES[n](options) for n in names}
