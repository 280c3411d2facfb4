"""One sequence's block ids in one KV group, kept in a growable int32 array.

A step copies each sequence's table into its batch table with one array copy; converting a Python list there
would cost time per block, and per-step host work must not grow with the sequence.
"""
from collections.abc import Iterable

import numpy as np

INITIAL_CAPACITY = 16


class BlockTable:
    def __init__(self, blocks: Iterable[int] = ()):
        self._data = np.zeros(INITIAL_CAPACITY, dtype=np.int32)
        self._len = 0
        self.extend(blocks)

    def array(self) -> np.ndarray:
        """The block ids as a view (valid until the table grows)."""
        return self._data[:self._len]

    def extend(self, blocks: Iterable[int]) -> None:
        new = np.fromiter(blocks, dtype=np.int32)
        end = self._len + len(new)
        if end > len(self._data):
            grown = np.zeros(max(end, 2 * len(self._data)), dtype=np.int32)
            grown[:self._len] = self.array()
            self._data = grown
        self._data[self._len:end] = new
        self._len = end

    def __len__(self) -> int:
        return self._len

    def _index(self, i: int) -> int:
        if not -self._len <= i < self._len:
            raise IndexError(f"block {i} of a table of {self._len}")
        return i % self._len

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.array()[i].tolist()
        return int(self._data[self._index(i)])

    def __setitem__(self, i: int, block: int) -> None:
        self._data[self._index(i)] = block

    def __iter__(self):
        return iter(self.array().tolist())

    def __reversed__(self):
        return iter(self.array()[::-1].tolist())

    def __repr__(self) -> str:
        return f"BlockTable({list(self)})"
