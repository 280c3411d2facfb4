"""One KV group's physical blocks: reference counts, a free list, and the prefix-cache index.

Block 0 is the null block: never handed out; block-table entries of blocks a sequence no longer holds (sliding
groups) point to it. Freed blocks that carry a prefix key stay findable until a new allocation evicts them. Each
cached block also keeps what it was computed from (its parent's key and its tokens): a lookup whose key matches
but whose identity does not is a miss.
"""
from collections import OrderedDict

NULL_BLOCK = 0

BlockIdentity = tuple[bytes, tuple[int, ...]]  # (parent block's key, the block's token ids)


class BlockPool:
    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError("a block pool needs at least 2 blocks (one is the null block)")
        self.num_blocks = num_blocks
        self.refs = [0] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self.key_of: dict[int, bytes] = {}
        self.identity_of: dict[int, BlockIdentity] = {}
        self.block_of: dict[bytes, int] = {}

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - 1 - len(self.free)

    def allocate(self) -> int:
        block, _ = self.free.popitem(last=False)
        if block in self.key_of:
            del self.block_of[self.key_of.pop(block)]
            del self.identity_of[block]
        self.refs[block] = 1
        return block

    def find(self, key: bytes, identity: BlockIdentity) -> int | None:
        """The cached block with this key, if it was computed from exactly this identity."""
        block = self.block_of.get(key)
        if block is None or self.identity_of[block] != identity:
            return None
        return block

    def take_cached(self, key: bytes, identity: BlockIdentity) -> int | None:
        block = self.find(key, identity)
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
            if block not in self.key_of:
                self.free.move_to_end(block, last=False)

    def register(self, block: int, key: bytes, identity: BlockIdentity) -> None:
        if block != NULL_BLOCK and key not in self.block_of and block not in self.key_of:
            self.block_of[key] = block
            self.key_of[block] = key
            self.identity_of[block] = identity
