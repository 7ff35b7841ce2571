"""Cached chunk KV placed into a request's cache layer by layer: all before the pass, or pipelined with it."""
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from workers.fusion.layout import BlendLayout
from workers.model.kv_cache import KVCache
from workers.model.rope import KeyRotation

FetchObserver = Callable[[str, float, int], None]
"""Told (tier, seconds, bytes) after each layer-chunk fetch."""


def ignore_fetch(tier: str, seconds: float, num_bytes: int) -> None:
    """Default observer: nobody is timing fetches."""


class LayerFeed(ABC):
    """One request's cached KV arriving in its cache; the pass waits for a layer before reading it."""

    @abstractmethod
    def wait(self, layer: int) -> None:
        """Return once every cached segment's KV of `layer` is in the cache (raises what the loading raised)."""

    def close(self) -> None:
        """Stop loading (the pass ended or failed) and release what loading holds."""

    def __enter__(self) -> "LayerFeed":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class TimedFeed(LayerFeed):
    """A feed that counts the seconds the pass spent waiting on it."""

    def __init__(self, feed: LayerFeed) -> None:
        self.feed = feed
        self.waited_s = 0.0

    def wait(self, layer: int) -> None:
        began = time.perf_counter()
        try:
            self.feed.wait(layer)
        finally:
            self.waited_s += time.perf_counter() - began

    def close(self) -> None:
        self.feed.close()


class LayerLoader(ABC):
    """How a request's cached KV is loaded relative to its recompute; chosen once per engine."""

    @abstractmethod
    def start(
        self, layout: BlendLayout, cache: KVCache, rotate: KeyRotation, observe: FetchObserver = ignore_fetch
    ) -> LayerFeed:
        """Begin loading the layout's cached segments into `cache`."""


def load_layer(layout: BlendLayout, cache: KVCache, layer: int, rotate: KeyRotation, observe: FetchObserver) -> None:
    """Fetch layer `layer` of every cached segment (one after another), timing each fetch, and place it."""
    for seg in layout.cached_segments():
        assert seg.cached is not None
        began = time.perf_counter()
        kv = next(seg.cached.layers)
        observe(seg.cached.source_tier, time.perf_counter() - began, kv.numel() * kv.element_size())
        if cache.data.is_cuda and not kv.is_cuda:
            # through torch's caching pinned allocator, so the copy to the GPU in `place` runs asynchronously
            kv = kv.pin_memory()
        seg.place(cache, layer, kv, rotate)


class _ReadyFeed(LayerFeed):
    """Everything is in the cache already."""

    def wait(self, layer: int) -> None:
        """Nothing to wait for."""


class EagerLoader(LayerLoader):
    """No pipeline: every layer of every cached chunk is loaded before the pass starts (TTFT = load + compute)."""

    def start(
        self, layout: BlendLayout, cache: KVCache, rotate: KeyRotation, observe: FetchObserver = ignore_fetch
    ) -> LayerFeed:
        for layer in range(cache.data.shape[0] if layout.cached_segments() else 0):
            load_layer(layout, cache, layer, rotate, observe)
        return _ReadyFeed()


class PipelinedLoader(LayerLoader):
    """A background thread loads layer i+1 (up to `depth` layers ahead) while the pass recomputes layer i."""

    def __init__(self, depth: int = 2) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.depth = depth

    def start(
        self, layout: BlendLayout, cache: KVCache, rotate: KeyRotation, observe: FetchObserver = ignore_fetch
    ) -> LayerFeed:
        if not layout.cached_segments():
            return _ReadyFeed()
        return _ThreadFeed(layout, cache, rotate, observe, self.depth)


class _ThreadFeed(LayerFeed):
    """The loader thread writes straight into the cache: layer i+1's slots are disjoint from layer i's."""

    def __init__(
        self, layout: BlendLayout, cache: KVCache, rotate: KeyRotation, observe: FetchObserver, depth: int
    ) -> None:
        self._num_layers = cache.data.shape[0]
        self._loaded = 0  # layers fully placed
        self._error: BaseException | None = None
        self._stopped = False
        self._permits = threading.Semaphore(depth)  # how far the loader may run ahead of the pass
        self._progress = threading.Condition()
        self._cuda = torch.cuda.Stream(cache.data.device) if cache.data.is_cuda else None
        self._events: list[torch.cuda.Event] = []
        self._thread = threading.Thread(
            target=self._run, args=(layout, cache, rotate, observe), name="blendserve-layer-loader", daemon=True
        )
        self._thread.start()

    @torch.inference_mode()  # per thread: the cache may be an inference tensor of the pass's thread
    def _run(self, layout: BlendLayout, cache: KVCache, rotate: KeyRotation, observe: FetchObserver) -> None:
        try:
            for layer in range(self._num_layers):
                self._permits.acquire()
                if self._stopped:
                    return
                if self._cuda is None:
                    load_layer(layout, cache, layer, rotate, observe)
                else:
                    # On a GPU the copies run on a side stream; the pass's stream waits on this layer's event.
                    with torch.cuda.stream(self._cuda):
                        load_layer(layout, cache, layer, rotate, observe)
                        event = torch.cuda.Event()
                        event.record(self._cuda)
                    self._events.append(event)
                with self._progress:
                    self._loaded = layer + 1
                    self._progress.notify_all()
        except BaseException as err:  # handed to the pass, which raises it
            with self._progress:
                self._error = err
                self._progress.notify_all()

    def wait(self, layer: int) -> None:
        with self._progress:
            self._progress.wait_for(lambda: self._loaded > layer or self._error is not None)
            if self._error is not None:
                raise self._error
        if self._cuda is not None:
            torch.cuda.current_stream(self._cuda.device).wait_event(self._events[layer])
        self._permits.release()

    def close(self) -> None:
        self._stopped = True
        self._permits.release()
        self._thread.join()
