"""cacheblend_boundary: every inexact chunk's opening span is kept before any span ranked by deviation."""
import torch

from workers.chunks.kv import ChunkLayers
from workers.fusion.base import FusionOptions
from workers.fusion.boundary_blend import BoundaryBlend, chunk_openings
from workers.fusion.deviation import keep_top_spans
from workers.fusion.layout import CHUNK, PREFIX, SUFFIX, BlendLayout, Segment
from workers.fusion.registry import FUSION_MODES
from workers.fusion.selective_pass import LayerStep


def _cached(start: int, end: int) -> ChunkLayers:
    return ChunkLayers(list(range(end - start)), iter(()), 1, base_position=start)


def _layout() -> BlendLayout:
    # prefix 0-8, chunk A 8-40 and chunk B 40-72 computed after the prompt's prefix (so A sits where it was
    # computed: exact), question 72-80
    segments = [Segment(0, 8, PREFIX, _cached(0, 8)), Segment(8, 40, CHUNK, _cached(8, 40)),
                Segment(40, 72, CHUNK, _cached(0, 32)), Segment(72, 80, SUFFIX)]
    return BlendLayout(torch.arange(80), segments, 80)


def _step(layout: BlendLayout) -> LayerStep:
    empty = torch.empty(0)
    return LayerStep(1, torch.arange(layout.kv_end), empty, empty, empty, None, layout)


def test_only_chunks_whose_cached_kv_is_inexact_have_an_opening() -> None:
    layout = _layout()
    assert layout.exact_end() == 40  # the prefix and chunk A are what a full prefill computes there
    openings = chunk_openings(_step(layout), span_tokens=16)
    assert openings.nonzero().squeeze(1).tolist() == list(range(40, 56))
    assert openings[40] == 16 and openings[55] == 1  # the chunk's first tokens weigh most


def test_the_opening_span_is_kept_even_where_it_deviates_least() -> None:
    layout = _layout()
    step = _step(layout)
    deviation = torch.ones(80)
    deviation[40:48] = 0.0  # chunk B's first tokens: no deviation at all at the check layer
    deviation[48:72] = 5.0
    forced = layout.forced[step.positions]
    mode = BoundaryBlend(FusionOptions(selection_span_tokens=16))
    # a budget of one aligned span: the one holding chunk B's first tokens, [32, 48)
    kept = keep_top_spans(mode.ranking(step, deviation), forced, 16, step.positions, 16).tolist()
    assert set(range(32, 48)) <= set(kept) and not set(range(48, 72)) & set(kept)
    # two spans: then the rest of the opening, [48, 64), before [64, 80) which deviates as much
    kept = keep_top_spans(mode.ranking(step, deviation), forced, 32, step.positions, 16).tolist()
    assert set(range(32, 64)) <= set(kept) and not set(range(64, 72)) & set(kept)
    plain = keep_top_spans(deviation, forced, 16, step.positions, 16).tolist()
    assert set(range(48, 64)) <= set(plain) and not set(range(32, 48)) & set(plain)  # cacheblend's choice
    assert FUSION_MODES["cacheblend_boundary"] is BoundaryBlend
