"""One fusion KV buffer reused from request to request once vLLM has released the previous request's KV."""
import torch

from workers.model.config import ModelConfig
from workers.model.kv_cache import KVCache
from workers.vllm.handoff import get_kv


class ReusedKVBuffer:
    """Hands each fusion a cache over the same memory when it is free, else a fresh one.

    A fresh 6k-token buffer (~140 MB) is faulted in page by page on first write (~35k minor faults), and that
    cost grew with the process's size in the benchmark (0.2 -> 0.6 s of system time per request). The buffer
    is free when its last fusion was released unused or vLLM dropped the KV lent under its handoff key.
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        self.config = config
        self.dtype = dtype
        self.device = device
        self._storage: torch.Tensor | None = None  # [L, 2, capacity, H_kv, D]
        self._in_use = False
        self._lent_key: str | None = None

    def take(self, capacity: int) -> KVCache:
        """A cache of `capacity` slots: over the reused memory when free (grown if too small), else fresh."""
        if self._in_use or (self._lent_key is not None and get_kv(self._lent_key) is not None):
            return KVCache(self.config, capacity, self.dtype, self.device)  # it still holds a live request's KV
        if self._storage is None or self._storage.shape[2] < capacity:
            self._storage = KVCache(self.config, capacity, self.dtype, self.device).data
        self._in_use, self._lent_key = True, None
        return KVCache(self.config, capacity, self.dtype, storage=self._storage)

    def release(self, cache: KVCache, held_under: str | None = None) -> None:
        """The fusion is done with `cache`: reusable now, or once vLLM drops the KV handed over under `held_under`."""
        if self._owns(cache):
            self._in_use, self._lent_key = False, held_under

    def _owns(self, cache: KVCache) -> bool:
        return self._storage is not None and cache.data.data_ptr() == self._storage.data_ptr()
