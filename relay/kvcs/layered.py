"""A read-only K or V cache produced one layer at a time.

A publisher walks a cache layer by layer (kvcs-draft 3.6), so a cache that can be computed
or read per layer (a synthetic one, a file) never needs to be whole in memory: a
``LayeredArray`` answers ``a[layer]`` and ``a[layer, ...]`` from a loader, keeping the few
layers used last. It offers what the publishing code reads of a numpy array (``shape``,
``ndim``, ``dtype``, ``nbytes``, indexing that starts with an integer layer) and no more.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

# Layers kept: production walks forward while a relay's re-FETCH (serving.py) may walk an
# earlier range at the same time; a few layers keep both from reloading every Object.
KEEP_LAYERS = 3


class LayeredArray:
    def __init__(self, shape: tuple[int, ...], dtype: np.dtype[Any],
                 load: Callable[[int], np.ndarray], keep: int = KEEP_LAYERS) -> None:
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.ndim = len(shape)
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize
        self._load = load
        self._keep = keep
        self._layers: OrderedDict[int, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> np.ndarray:
        layer, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        if not isinstance(layer, int | np.integer):
            raise TypeError("a LayeredArray is indexed by an integer layer first")
        arr = self.layer(int(layer))
        return arr[rest] if rest else arr

    def layer(self, layer: int) -> np.ndarray:
        if not 0 <= layer < self.shape[0]:
            raise IndexError(f"layer {layer} is outside 0..{self.shape[0] - 1}")
        arr = self._layers.get(layer)
        if arr is None:
            arr = self._load(layer)
            if arr.shape != self.shape[1:] or arr.dtype != self.dtype:
                raise ValueError(f"layer {layer} loaded as {arr.shape} {arr.dtype}, not "
                                 f"{self.shape[1:]} {self.dtype}")
            arr.flags.writeable = False  # a layer read back later must be the same octets
            self._layers[layer] = arr
            while len(self._layers) > self._keep:
                self._layers.popitem(last=False)
        else:
            self._layers.move_to_end(layer)
        return arr


# What the producer side accepts as K or V: a whole array (numpy, memmap) or one made per layer.
KvArray = np.ndarray | LayeredArray
