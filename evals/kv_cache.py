"""KV caches of the generation loop (transformers ``Cache`` objects made of ``DynamicLayer``
subclasses, built at first use so that importing this module needs no transformers).

:func:`PreallocatedCache` (single process, every backend): each layer's keys and values live
in one buffer ``[B, Hkv, capacity, D]`` allocated at the prefill (capacity = the generate
call's ``max_length``: prompt + new tokens), and a step writes its token in place and returns
the view ``[B, Hkv, :T, D]``. transformers' ``DynamicCache`` concatenates the whole cache with
the new token at every step of every layer instead: on a 2-core CPU that copy was 35-42 % of a
SmolLM2 decode step (batch 8, 900 cached tokens). The keys and values are the same numbers
(only the batch and head strides of the view differ), so attention sees the same inputs;
tests/e2e/test_fast_path.py checks that generations keep their bits.

:func:`DCPShardedCache` (one rank of a real process group): only the positions the rank owns.
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def _preallocated_layer_class():
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """One layer: ``keys``/``values`` are views ``[B, Hkv, :T, D]`` of buffers of
        ``capacity`` positions (grown by doubling if a call writes past it). Greedy and
        sampled generation only: no beam search, no cropping (they would re-index the
        buffers)."""

        is_croppable = False

        def __init__(self, capacity: int):
            super().__init__()
            self.capacity = int(capacity)
            self.length = 0
            self._k = self._v = None

        def lazy_initialization(self, key_states, value_states):
            self.device = key_states.device
            cap = max(self.capacity, key_states.shape[-2])
            self._k = key_states.new_empty((*key_states.shape[:2], cap, key_states.shape[-1]))
            self._v = value_states.new_empty((*value_states.shape[:2], cap,
                                              value_states.shape[-1]))
            self.length = 0
            self.keys, self.values = self._k[..., :0, :], self._v[..., :0, :]
            self.is_initialized = True

        def _grow(self, need: int) -> None:
            cap = max(need, 2 * self._k.shape[-2])
            for name in ("_k", "_v"):
                old = getattr(self, name)
                new = old.new_empty((*old.shape[:2], cap, old.shape[-1]))
                new[..., :self.length, :].copy_(old[..., :self.length, :])
                setattr(self, name, new)

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self._k.shape[-2]:
                self._grow(end)
            self._k[..., self.length:end, :].copy_(key_states)
            self._v[..., self.length:end, :].copy_(value_states)
            self.length = end
            self.keys, self.values = self._k[..., :end, :], self._v[..., :end, :]
            return self.keys, self.values

        def reset(self) -> None:
            super().reset()
            self._k = self._v = None
            self.length = 0

        def crop(self, tokens_to_remove: int) -> None:
            raise NotImplementedError("the preallocated cache cannot be cropped")

        def batch_repeat_interleave(self, repeats: int) -> None:
            raise NotImplementedError("the preallocated cache does not re-index its batch")

        def batch_select_indices(self, indices) -> None:
            raise NotImplementedError("the preallocated cache does not re-index its batch")

    return PreallocatedLayer


def PreallocatedCache(config, capacity: int):
    """A ``Cache`` of :func:`_preallocated_layer_class` layers for ``config``'s text model, or
    None where one would not be a drop-in for ``DynamicCache``: a model with sliding-window or
    other non-full-attention layers (their cache layers evict old positions)."""
    from transformers.cache_utils import Cache

    cfg = config.get_text_config()
    types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in types) or getattr(cfg, "use_sliding_window", False):
        return None
    cls = _preallocated_layer_class()
    return Cache(layers=[cls(capacity) for _ in range(cfg.num_hidden_layers)])


@functools.lru_cache(maxsize=None)
def _shard_layer_class():
    """The cache layer class of :func:`DCPShardedCache`, derived from transformers'
    ``DynamicLayer`` at first use (importing this module needs no transformers)."""
    from transformers.cache_utils import DynamicLayer

    class DCPShardLayer(DynamicLayer):
        """One layer's KV cache on one DCP rank: only the positions j with
        ``(j // interleave) % world_size == rank`` are stored.

        ``update`` with several tokens is the (unsharded) prefill of an empty cache: it stores
        the owned positions and returns all the keys, so SDPA prefills as the unsharded model
        does. With one token (a decode step) it appends the token if owned and returns the
        local keys only. ``positions``: their global positions; ``total``: the global length
        (what ``get_seq_length`` reports, so transformers' positions and masks stay global)."""

        def __init__(self, rank: int, world_size: int, interleave: int):
            super().__init__()
            self.rank, self.world_size, self.interleave = rank, world_size, interleave
            self.total = 0
            self.positions = None

        def lazy_initialization(self, key_states, value_states):
            self.device = key_states.device
            self.keys = key_states[..., :0, :]
            self.values = value_states[..., :0, :]
            self.positions = torch.zeros(0, dtype=torch.long, device=self.device)
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            t = key_states.shape[-2]
            if t > 1 and self.total:
                raise NotImplementedError("the sharded DCP cache takes one prefill of an "
                                          "empty cache, then one token a step")
            pos = torch.arange(self.total, self.total + t, device=self.device)
            mine = (pos // self.interleave) % self.world_size == self.rank
            self.keys = torch.cat([self.keys, key_states[..., mine, :]], dim=-2)
            self.values = torch.cat([self.values, value_states[..., mine, :]], dim=-2)
            self.positions = torch.cat([self.positions, pos[mine]])
            self.total += t
            if t > 1:
                return key_states, value_states
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.total

        def reset(self) -> None:
            super().reset()
            self.total = 0
            self.positions = None

        def crop(self, tokens_to_remove: int) -> None:
            raise NotImplementedError("the sharded DCP cache cannot be cropped")

    return DCPShardLayer


def DCPShardedCache(num_layers: int, rank: int, world_size: int, interleave: int = 1):
    """A transformers ``Cache`` holding DCP rank ``rank``'s shard of the KV cache, one
    ``DCPShardLayer`` per layer (see :func:`_shard_layer_class`): the positions j with
    ``(j // interleave) % world_size == rank``, as a DCP engine's KV cache. Pass it to
    ``generate(past_key_values=...)`` and set it as ``DCPSettings.kv_cache``."""
    from transformers.cache_utils import Cache

    cls = _shard_layer_class()
    return Cache(layers=[cls(rank, world_size, interleave) for _ in range(num_layers)])

