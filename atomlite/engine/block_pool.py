"""One KV group's physical blocks: reference counts, a free list, and the prefix-cache index.

Block 0 is the null block: never handed out; block-table entries of blocks a sequence no longer holds (sliding
groups) point to it. Freed blocks that carry a prefix hash stay findable until a new allocation evicts them.
"""
from collections import OrderedDict

NULL_BLOCK = 0


class BlockPool:
    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError("a block pool needs at least 2 blocks (one is the null block)")
        self.num_blocks = num_blocks
        self.refs = [0] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self.hash_of: dict[int, int] = {}
        self.block_of: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - 1 - len(self.free)

    def allocate(self) -> int:
        block, _ = self.free.popitem(last=False)
        if block in self.hash_of:
            del self.block_of[self.hash_of.pop(block)]
        self.refs[block] = 1
        return block

    def take_cached(self, block_hash: int) -> int | None:
        block = self.block_of.get(block_hash)
        if block is None:
            return None
        if self.refs[block] == 0:
            del self.free[block]
        self.refs[block] += 1
        return block

    def release(self, block: int) -> None:
        if block == NULL_BLOCK:
            return
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free[block] = None
            if block not in self.hash_of:
                self.free.move_to_end(block, last=False)

    def register(self, block: int, block_hash: int) -> None:
        if block != NULL_BLOCK and block_hash not in self.block_of and block not in self.hash_of:
            self.block_of[block_hash] = block
            self.hash_of[block] = block_hash
