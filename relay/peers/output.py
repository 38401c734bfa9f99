"""``--out`` of ``kvcs fetch`` / ``kvcs subscribe``: the retrieval reassembles straight into
the output file's mapping, so when the last layer is usable the file is written too (the
kernel writes its pages back meanwhile), instead of writing the whole cache afterwards
(about 1 s for 512 MiB).

The file is made for the whole prompt (every block the consumer could reuse) under a
temporary name and renamed once the retrieval ends. If fewer blocks were reused, that
layout (K and V shaped by the token count) is not the result's: the file is then written
anew from the arrays. A retrieval that fails leaves no file behind.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from relay.kvcs.descriptor import Descriptor
from relay.kvcs.kvfile import map_new_kvfile, write_kvfile


class OutputFile:
    def __init__(self, path: Path, descriptor: Descriptor, tokens: Sequence[int]) -> None:
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        self.descriptor = descriptor
        self.tokens = list(tokens)
        self.shape: tuple[int, int, int, int] | None = None

    def allocate(self, shape: tuple[int, int, int, int]) -> tuple[np.ndarray, np.ndarray]:
        """RetrieveOptions.allocate: K and V mapped from the new file (plain arrays where
        the host cannot map them)."""
        mapped = map_new_kvfile(self.partial, shape, self.descriptor, self.tokens[:shape[2]])
        if mapped is None:
            return np.zeros(shape, self.descriptor.dtype), np.zeros(shape, self.descriptor.dtype)
        self.shape = shape
        return mapped

    def write(self, k: np.ndarray, v: np.ndarray, tokens: Sequence[int]) -> None:
        """The result's K, V and tokens into ``path``: a rename if they fill the mapped
        file (not yet written back pages are the file's: no flush needed), else written."""
        if self.shape is not None and k.shape == self.shape:
            os.replace(self.partial, self.path)
            return
        write_kvfile(self.path, k, v, self.descriptor, tokens)
        self.discard()

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.partial.unlink()
