import enum
import itertools
import time
from dataclasses import dataclass, field

from atomlite.engine.kv.block_table import BlockTable
from atomlite.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_ids = itertools.count()


@dataclass(eq=False, slots=True)
class Sequence:
    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str = ""
    priority: int = 0  # the priority scheduling policy runs lower values first
    seq_id: int = field(default_factory=lambda: next(_ids))
    token_ids: list[int] = field(init=False)
    status: Status = Status.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    block_tables: list[BlockTable] = field(default_factory=list)  # one per KV group
    block_keys: list[bytes] = field(default_factory=list)  # prefix-cache keys of its first full blocks, kept
    num_registered_blocks: int = 0  # full computed blocks whose keys the cache can find
    released_until: list[int] = field(default_factory=list)  # per KV group: blocks before it are released
    kv_covered_tokens: int = 0  # positions below it have a block in every group (the scheduler's fast check)
    spec_token_ids: list[int] = field(default_factory=list)  # drafts the next step verifies after token_ids
    logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_logprobs: list[dict[int, float] | None] = field(default_factory=list)
    finish_reason: str | None = None
    num_sent_tokens: int = 0  # output tokens already handed out in an update
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    images: list = field(default_factory=list)  # seq_images.SeqItem, in prompt order: its images and video frames
    lora: object = None  # its LoRARequest (atomlite.lora), None: the base model
    lora_key: bytes = b""  # what names its adapter's weights in prefix-cache keys (b"": the base model)
    lora_slot: int = -1  # the device slot its adapter is in for the step being built

    def __post_init__(self):
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def output_token_ids_from(self, start: int) -> list[int]:
        """Output tokens start.. on, without copying the ones before (per-step work must not grow with length)."""
        return self.token_ids[self.num_prompt_tokens + start:]

    def input_ids(self, first: int, count: int) -> list[int]:
        """The ids of positions first..first+count-1: token_ids, then the drafts being verified."""
        ids = self.token_ids[first:first + count]
        return ids if len(ids) == count else ids + self.spec_token_ids[:count - len(ids)]

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == Status.FINISHED

    def reset_for_recompute(self) -> None:
        self.num_computed_tokens = self.num_cached_tokens = 0
        self.block_tables, self.released_until = [], []
        self.num_registered_blocks = self.kv_covered_tokens = 0
        self.spec_token_ids = []
        self.status = Status.WAITING
