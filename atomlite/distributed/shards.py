"""Shard arithmetic: which part of a dimension a rank holds. Uneven splits are refused, naming the dimension."""
from dataclasses import dataclass

from atomlite.errors import ConfigError


@dataclass(frozen=True)
class Shard:
    """Elements [start, start + size) of a dimension of `total`."""
    start: int
    size: int
    total: int

    @property
    def stop(self) -> int:
        return self.start + self.size

    @property
    def whole(self) -> bool:
        return self.size == self.total

    def scaled(self, factor: int) -> "Shard":
        """The same shard counted in units `factor` times larger (head -> its rows, one per head dim)."""
        return Shard(self.start * factor, self.size * factor, self.total * factor)

    def in_blocks(self, block: int, what: str) -> "Shard":
        """The shard counted in blocks of `block` elements (packed pairs, MXFP4 scale blocks); it must fall on
        their boundaries."""
        if self.start % block or self.size % block:
            raise ConfigError(f"{what}: the shard [{self.start}, {self.stop}) of {self.total} does not fall on "
                              f"{block}-element boundaries; choose a tensor-parallel size that splits {what} into "
                              f"multiples of {block}")
        return Shard(self.start // block, self.size // block, -(-self.total // block))


def split(total: int, rank: int, size: int, what: str) -> Shard:
    """Rank's equal part of a dimension; what names the dimension (a config key) for the error."""
    if total % size:
        raise ConfigError(f"{what} = {total} is not divisible by the tensor-parallel size {size}; use a "
                          f"--tensor-parallel-size that divides it")
    part = total // size
    return Shard(rank * part, part, total)


def kv_heads_of_rank(num_kv_heads: int, num_heads: int, rank: int, size: int, what: str) -> Shard:
    """The KV heads rank keeps: its equal part when there are at least as many as ranks; else the one KV head its
    query heads read (replicated on the ranks that share it)."""
    if num_kv_heads >= size:
        return split(num_kv_heads, rank, size, what)
    queries = split(num_heads, rank, size, "num_attention_heads")
    per_kv = num_heads // num_kv_heads
    if per_kv % queries.size:
        raise ConfigError(f"{what} = {num_kv_heads} is fewer than the tensor-parallel size {size}, and a rank's "
                          f"{queries.size} query heads would read different KV heads; use a tensor-parallel size "
                          f"that is a multiple of {num_kv_heads}")
    return Shard(queries.start // per_kv, 1, num_kv_heads)
