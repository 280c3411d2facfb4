"""KV blocks: one pool of pages shared by every KV group (PagePool), and each group's blocks carved from the pages it
holds (BlockPool: reference counts, the free blocks of its pages, its prefix-cache index). kv_layout says where a
page's blocks lie.

Block 0 of every group is its null block, in page 0, which is never handed out: block-table entries of blocks a
sequence no longer holds (sliding groups) point to it. A page goes back to the shared pool once none of its blocks
is held. Freed blocks that carry a prefix key stay findable until an allocation evicts them: free pages and a
group's free blocks are handed out blocks without a key first, then the least recently freed. Each cached block
also keeps what it was computed from (its parent's key and its tokens): a lookup whose key matches but whose
identity does not is a miss.
"""
import math
from collections import OrderedDict

NULL_BLOCK = 0
NULL_PAGE = 0

BlockIdentity = tuple[bytes, tuple[int, ...]]  # (parent block's key, the block's token ids)


class PagePool:
    """The free pages, and for each page the group whose blocks it holds (a free page's may still be cached)."""

    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise ValueError("a page pool needs at least 2 pages (one holds the null blocks)")
        self.num_pages = num_pages
        self.free: OrderedDict[int, None] = OrderedDict((p, None) for p in range(1, num_pages))
        self.holder: list["BlockPool | None"] = [None] * num_pages

    @property
    def num_free(self) -> int:
        return len(self.free)

    def take(self, group: "BlockPool") -> int:
        page, _ = self.free.popitem(last=False)
        previous = self.holder[page]
        if previous is not None:
            previous.forget_page(page)
        self.holder[page] = group
        return page

    def give_back(self, page: int, cached: bool) -> None:
        self.free[page] = None
        if not cached:
            self.free.move_to_end(page, last=False)

    def reclaim(self, page: int) -> None:
        """A free page one of whose cached blocks is wanted again: its holder keeps it."""
        del self.free[page]


class BlockPool:
    """One KV group's blocks: block b lies in page b // blocks_per_page."""

    def __init__(self, pages: PagePool, blocks_per_page: int = 1):
        self.pages, self.per_page = pages, blocks_per_page
        self.num_blocks = pages.num_pages * blocks_per_page
        self.refs = [0] * self.num_blocks
        self.held_in_page: dict[int, int] = {}  # page in use by this group -> its blocks with references
        self.loose: OrderedDict[int, None] = OrderedDict()  # free blocks of pages in use: keyless ones first
        self.num_used = 0
        self.key_of: dict[int, bytes] = {}
        self.identity_of: dict[int, BlockIdentity] = {}
        self.block_of: dict[bytes, int] = {}

    @property
    def num_usable(self) -> int:
        """The most blocks this group could hold (every page but the null one)."""
        return (self.pages.num_pages - 1) * self.per_page

    def pages_needed(self, num_blocks: int) -> int:
        """The free pages that num_blocks more blocks would take from the shared pool."""
        return math.ceil(max(0, num_blocks - len(self.loose)) / self.per_page)

    def allocate(self) -> int:
        """A free block (the caller checked that one can be had: pages_needed)."""
        if self.loose and next(iter(self.loose)) not in self.key_of:
            block, _ = self.loose.popitem(last=False)
        elif self.pages.num_free:
            block = self._open_page(self.pages.take(self))
        else:
            block, _ = self.loose.popitem(last=False)
        self._forget(block)
        self._hold(block)
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
            page = block // self.per_page
            if page in self.held_in_page:
                del self.loose[block]
            else:
                self.pages.reclaim(page)
                self._open_page(page, block)
            self._hold(block)
        else:
            self.refs[block] += 1
        return block

    def release(self, block: int) -> None:
        if block == NULL_BLOCK:
            return
        self.refs[block] -= 1
        if self.refs[block]:
            return
        self.num_used -= 1
        page = block // self.per_page
        self.held_in_page[page] -= 1
        if self.held_in_page[page]:
            self._loosen(block)
            return
        del self.held_in_page[page]
        for other in self._blocks_of(page):
            self.loose.pop(other, None)
        self.pages.give_back(page, cached=any(b in self.key_of for b in self._blocks_of(page)))

    def register(self, block: int, key: bytes, identity: BlockIdentity) -> None:
        if block != NULL_BLOCK and key not in self.block_of and block not in self.key_of:
            self.block_of[key] = block
            self.key_of[block] = key
            self.identity_of[block] = identity

    def forget_page(self, page: int) -> None:
        """The shared pool gave this free page to an allocation: its blocks' keys go."""
        for block in self._blocks_of(page):
            self._forget(block)

    # -- internals ------------------------------------------------------------------------------------------
    def _blocks_of(self, page: int) -> range:
        return range(page * self.per_page, (page + 1) * self.per_page)

    def _open_page(self, page: int, wanted: int | None = None) -> int:
        """Start using page: its blocks but `wanted` (the first one by default) become loose; returns wanted."""
        blocks = self._blocks_of(page)
        wanted = blocks[0] if wanted is None else wanted
        self.held_in_page[page] = 0
        for block in reversed(blocks):  # keyless ones go to the front: the page's blocks then go in order
            if block != wanted:
                self._loosen(block)
        return wanted

    def _loosen(self, block: int) -> None:
        self.loose[block] = None
        if block not in self.key_of:
            self.loose.move_to_end(block, last=False)

    def _hold(self, block: int) -> None:
        self.refs[block] = 1
        self.num_used += 1
        self.held_in_page[block // self.per_page] += 1

    def _forget(self, block: int) -> None:
        key = self.key_of.pop(block, None)
        if key is not None:
            del self.block_of[key]
            del self.identity_of[block]
