"""A request's cached parts looked up (layer streams, not yet read), per the loading controller's plan if any."""
from dataclasses import dataclass

from workers.chunks.kv import ChunkLayers
from workers.chunks.sources import PREFIX_INDEX, ChunkSources, prompt_parts
from workers.chunks.store import ChunkRef, ChunkStore, stored_impact
from workers.chunks.variants import VariantIndex, chunk_keys
from workers.fusion.layout import BlendLayout
from workers.generation.prompt import PromptLayout
from workers.loading.controller import LoadingController
from workers.loading.plan import ChunkPlacement, LoadingPlan


@dataclass(frozen=True, slots=True)
class LookupResult:
    """The layout with its cached parts opened, the recompute_ratio to run at, and the plan that chose them (if any)."""

    layout: BlendLayout
    recompute_ratio: float
    plan: LoadingPlan | None = None


def lookup_layout(
    store: ChunkStore,
    prompt: PromptLayout,
    *,
    sources: ChunkSources,
    namespace: str,
    recompute_ratio: float,
    controller: LoadingController | None = None,
    layer_bytes_per_token: int = 0,
    kv_end: int | None = None,
    variants: VariantIndex | None = None,
) -> LookupResult:
    """Open every cached part (prefix and chunks); with a controller, from its chosen tier or not at all.

    `sources` says which stored version each part reads at its place; the request's recompute_ratio is the
    controller's floor for this request; the pass computes KV for the first `kv_end` tokens (None: all). Each
    opened chunk carries its stored context impact, where a use has measured one. With `variants`, a chunk is read
    from its best-fitting variant where one fits well enough.
    """
    kv_end = len(prompt.token_ids) if kv_end is None else kv_end
    parts = prompt_parts(prompt)
    read = {index: sources.read_at(index, prompt, namespace) for index, _ in parts}
    base_context = sources.context_ids(False, prompt)  # variants and impacts are keyed by the base version
    tiers: dict[int, str | None] = {index: None for index, _ in parts}
    skipped: set[int] = set()
    plan = None
    if controller is not None and parts:
        placements = [
            ChunkPlacement(
                str(index),
                len(ids),
                len(ids) * layer_bytes_per_token,
                tuple(store.tiers_of(ids, read[index].context_ids, read[index].namespace)),
            )
            for index, ids in parts
        ]
        question_tokens = kv_end - (len(prompt.token_ids) - len(prompt.suffix_ids))  # computed by the pass
        plan = controller.plan(placements, max(question_tokens, 0), recompute_ratio)
        recompute_ratio = plan.recompute_ratio
        for (index, _), placement, action in zip(parts, placements, plan.actions):
            tiers[index] = action.tier
            if action.recompute and placement.tiers:
                skipped.add(index)
    # Parts with no tier chosen are read from the fastest holding each, in one batch (one call per node shard).
    batch = [(index, ids) for index, ids in parts if index not in skipped and tiers[index] is None]
    found = store.read_layers_many([ChunkRef(ids, read[index].context_ids, read[index].namespace)
                                    for index, ids in batch])
    opened: dict[int, ChunkLayers | None] = {index: layers for (index, _), layers in zip(batch, found)}
    for index, ids in parts:
        if index not in opened:  # skipped, or from the tier the controller chose
            source = read[index]
            opened[index] = None if index in skipped else store.read_layers(
                ids, source.context_ids, source.namespace, tiers[index]
            )
    for index, ids in parts:
        layers = opened[index]
        if layers is None or index == PREFIX_INDEX:
            continue
        if variants is not None:
            layers = open_variant(store, prompt, index, base_context, namespace, variants) or layers
        layers.impact = stored_impact(store, ids, base_context, namespace)
        opened[index] = layers
    layout = BlendLayout.build(
        prompt,
        [opened[index] for index in range(len(prompt.chunk_ids))],
        opened.get(PREFIX_INDEX),
        frozenset(skipped),
        kv_end,
    )
    return LookupResult(layout, recompute_ratio, plan)


def open_variant(
    store: ChunkStore, prompt: PromptLayout, index: int, base_context: list[int], namespace: str,
    variants: VariantIndex,
) -> ChunkLayers | None:
    """Chunk `index` read from the variant that best fits the chunks before it here, if one fits and is still held."""
    keys = chunk_keys(store, prompt.chunk_ids[: index + 1], base_context, namespace)
    found = variants.best(keys[index], keys[:index])
    if found is None:
        return None
    variant, score = found
    layers = store.read_layers(prompt.chunk_ids[index], list(variant.context_ids), namespace)
    if layers is not None:
        layers.variant_score = score
    return layers
