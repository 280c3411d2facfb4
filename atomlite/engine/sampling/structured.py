"""Structured outputs (constrained decoding) with xgrammar.

A request's StructuredOutputsParams (JSON schema, regex, choice, EBNF grammar or any JSON object) becomes an
xgrammar grammar, compiled against the model tokenizer's vocabulary padded to the logits width and cached per spec;
each constrained sequence gets a GrammarMatcher. Each step the host fills a bitmask row per constrained sequence
(bit j of int32 word w set: token 32w + j allowed), every bit set in the other rows, while the GPU runs the forward;
the device unpacks it with torch ops and sets disallowed logits to -inf before greedy and sampled rows choose. Each
token taken advances its sequence's matcher; once the grammar is complete and only a stop token may follow, the
sequence is done.

Compiling never runs inside the step loop: a grammar thread hands each compile to a process of its own
(grammar_worker.py, at a lower CPU priority) and reads the compiled grammar back. A request waits for its grammar
while the batch runs on; one whose compile passes compile_timeout_s fails as a 400 naming the field, its compile
killed (the same spec sent again is refused at once). Compiled grammars are cached by a hash of their spec, bounded
in bytes (vLLM's VLLM_XGRAMMAR_CACHE_MB idea).

The grammar constrains the text the client gets: where special tokens are left out of it (skip_special_tokens, the
default) the grammar never picks one, but for a stop token at the end; where they are kept, a literal matches a
special token by its text, as the client will read it, and Token(id) names one.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import re
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Collection
from typing import TYPE_CHECKING

import torch

from atomlite.engine.sampling.grammar_worker import CompileDropped, CompileTimeout, GrammarWorker
from atomlite.engine.sampling.schema_shape import check_schema_shape
from atomlite.engine.sampling.token_mask import unpack_bitmask

from atomlite.engine.sequence import Sequence
from atomlite.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    import xgrammar as xgr

logger = logging.getLogger("atomlite")
MAX_CACHED_GRAMMAR_BYTES = 128 * 2**20
COMPILE_TIMEOUT_S = 30.0
MAX_CHECKED = 1024  # spec hashes the API process found valid
MAX_SLOW_SPECS = 1024
JSON_OBJECT_SCHEMA = '{"type": "object"}'
_XGRAMMAR_LOCATION = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")  # "[20:31:21] /project/cpp/regex_converter.cc:83: "


def _xgr():
    """xgrammar, imported when a grammar is first needed: an engine that never constrains never loads it (a server
    imports it as it starts: preload)."""
    import xgrammar
    return xgrammar


def preload() -> None:
    """Imports xgrammar now: its import held the GIL for ~170 ms, which on a server's first grammar stalled every
    stream (the engine core) or /health (the API process)."""
    _xgr()


def choice_grammar(choices: list[str]) -> str:
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)  # JSON escapes are EBNF's


def _grammar(kind: str, text: str) -> xgr.Grammar:
    """The grammar of a spec's cache key (StructuredOutputsParams.cache_key)."""
    # JSON comes compact (", " and ": ", no other whitespace between tokens): free whitespace lets a model pad
    # without end until max_tokens, the best-known failure of constrained JSON; OpenAI's output is compact too
    if kind == "json":
        return _xgr().Grammar.from_json_schema(text, any_whitespace=False)
    if kind == "json_object":
        return _xgr().Grammar.from_json_schema(JSON_OBJECT_SCHEMA, any_whitespace=False)
    if kind == "regex":
        return _xgr().Grammar.from_regex(text)
    if kind == "choice":
        return _xgr().Grammar.from_ebnf(choice_grammar(json.loads(text)))
    return _xgr().Grammar.from_ebnf(text)


def _invalid(name: str, error: Exception) -> ValueError:
    message = _XGRAMMAR_LOCATION.sub("", str(error).strip())
    return ValueError(f"{name} is invalid: {message}")


def compile_spec(compiler: xgr.GrammarCompiler, kind: str, text: str, field: str) -> xgr.CompiledGrammar:
    """The grammar of a spec's cache key compiled; a ValueError naming field if it makes none."""
    if kind == "json":
        check_schema_shape(text, field)
    try:
        return compiler.compile_grammar(_grammar(kind, text))
    except RuntimeError as e:
        raise _invalid(field, e) from None


def spec_hash(kind: str, text: str) -> bytes:
    return hashlib.sha256(f"{kind}\0{text}".encode("utf-8", "surrogatepass")).digest()


_checked: OrderedDict[bytes, None] = OrderedDict()  # hashes only: a cache must not keep a 3 MB schema alive


def _stop(pool: concurrent.futures.ThreadPoolExecutor, worker: GrammarWorker) -> None:
    """An engine's grammar thread and process, ended with it."""
    pool.shutdown(wait=False, cancel_futures=True)
    worker.stop()


def check_structured_outputs(spec: StructuredOutputsParams, name: str | None = None) -> None:
    """Raises a ValueError naming the field (`name`, by default structured_outputs.KIND) unless spec makes a valid
    grammar. Needs no tokenizer, so the API process can refuse a bad request before it is queued; the engine's
    compile then does not fail on it."""
    field = name or f"structured_outputs.{spec.kind}"
    try:
        kind, text = spec.cache_key
    except RecursionError:
        raise ValueError(f"{field} is nested too deeply") from None
    key = spec_hash(kind, text)
    if key in _checked:
        _checked.move_to_end(key)
        return
    if kind == "json":
        check_schema_shape(text, field)
    try:
        _grammar(kind, text)
    except RuntimeError as e:
        raise _invalid(field, e) from None
    _checked[key] = None
    if len(_checked) > MAX_CHECKED:
        _checked.popitem(last=False)


def _without_special_tokens(info: xgr.TokenizerInfo, tokenizer, vocab_size: int) -> xgr.TokenizerInfo:
    """info with the tokenizer's special tokens as empty strings, which xgrammar never matches to text (stop
    tokens still end the output). xgrammar otherwise takes a special token for its text: "<pad>" inside a JSON
    string, say, which the client's text would not show."""
    special = set(tokenizer.all_special_ids)
    special |= {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
    vocab = [""] * vocab_size
    for text, i in tokenizer.get_vocab().items():
        if i < vocab_size and i not in special:
            vocab[i] = text
    return _xgr().TokenizerInfo(vocab, info.vocab_type, vocab_size=vocab_size, stop_token_ids=info.stop_token_ids,
                             add_prefix_space=info.add_prefix_space)


class StructuredOutputs:
    """The engine's constrained sequences: compiled grammars (cached by spec), a matcher per sequence, the bitmask
    of a batch and the end of a sequence's grammar."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: Collection[int]):
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self.words = (vocab_size + 31) // 32
        self._infos: dict[bool, xgr.TokenizerInfo] = {}  # by skip_special_tokens; made on first use
        self._compilers: dict[bool, xgr.GrammarCompiler] = {}  # compile()'s, in this process
        self._compiled: OrderedDict[bytes, xgr.CompiledGrammar] = OrderedDict()
        self._compiled_bytes = 0
        self._matchers: dict[int, xgr.GrammarMatcher] = {}
        self.compile_timeout_s = COMPILE_TIMEOUT_S
        # the grammar thread (started by the first compile) and the grammar process, ended with this object
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="atomlite-grammar")
        self._worker = GrammarWorker()
        weakref.finalize(self, _stop, self._pool, self._worker)
        self._compiling: dict[int, tuple[Sequence, bytes, concurrent.futures.Future, threading.Event]] = {}
        self._too_slow: OrderedDict[bytes, None] = OrderedDict()
        self._filler = None  # an xgrammar BatchGrammarMatcher, made on first use
        self._host: torch.Tensor | None = None

    def add(self, seq: Sequence) -> None:
        """Gives seq a matcher of its params' grammar, compiling it here; a ValueError naming the field if it does
        not compile. The engine uses start() instead, which compiles off the step loop."""
        params = seq.params
        self._matchers[seq.seq_id] = _xgr().GrammarMatcher(self.compile(params.structured_outputs,
                                                                     params.skip_special_tokens))

    def start(self, seq: Sequence) -> bool:
        """True when seq's grammar was cached and its matcher is made; else its compile starts on the grammar
        thread and the sequence waits (compiled() hands it back, or its error). A ValueError if the spec was too slow
        before. The spec is not checked here: even building a grammar can take seconds (1.7 s for a 100,000-value
        enum), so callers check it first (check_structured_outputs: the API process, LLM)."""
        spec, skip = seq.params.structured_outputs, seq.params.skip_special_tokens
        key = self._key(spec, skip)
        if key in self._compiled:
            self._compiled.move_to_end(key)
            self._matchers[seq.seq_id] = _xgr().GrammarMatcher(self._compiled[key])
            return True
        if key in self._too_slow:
            raise self._slow_error(spec)
        dropped = threading.Event()
        future = self._pool.submit(self._compile_in_worker, spec, skip, dropped)
        self._compiling[seq.seq_id] = (seq, key, future, dropped)
        return False

    def start_grammar_process(self) -> None:
        """Starts the grammar process now rather than at the first grammar: its imports (~4 s of a core, xgrammar
        brings torch) then compete with no running stream, and the first grammar does not wait for them. The
        server's engine core does this before it says it is ready."""
        if self.tokenizer is None:
            return
        try:
            self._worker.start()
        except RuntimeError as e:  # the first grammar tries again, and fails naming its field if it cannot
            logger.warning("%s", e)

    @property
    def compiling(self) -> bool:
        return bool(self._compiling)

    def compiled(self, wait_s: float = 0.0) -> tuple[list[Sequence], list[tuple[Sequence, str]]]:
        """(sequences whose grammar is ready, now with matchers; (sequence, error) for those whose grammar failed
        or passed the time limit). wait_s: how long to wait for a compile to end when none has."""
        if wait_s and self._compiling:
            futures = [future for _, _, future, _ in self._compiling.values()]
            concurrent.futures.wait(futures, timeout=wait_s, return_when=concurrent.futures.FIRST_COMPLETED)
        ready, failed = [], []
        for seq_id, (seq, key, future, _) in list(self._compiling.items()):
            if not future.done():
                continue
            del self._compiling[seq_id]
            try:
                compiled = future.result()
            except CompileTimeout:
                self._too_slow[key] = None
                if len(self._too_slow) > MAX_SLOW_SPECS:
                    self._too_slow.popitem(last=False)
                failed.append((seq, str(self._slow_error(seq.params.structured_outputs))))
                continue
            except ValueError as e:
                failed.append((seq, str(e)))
                continue
            self._cache(key, compiled)
            self._matchers[seq_id] = _xgr().GrammarMatcher(compiled)
            ready.append(seq)
        return ready, failed

    def _slow_error(self, spec: StructuredOutputsParams) -> ValueError:
        return ValueError(f"structured_outputs.{spec.kind} is too large: its grammar did not compile within "
                          f"{self.compile_timeout_s:g} s; simplify it (fewer enum values, less nesting)")

    def drop(self, seq: Sequence) -> None:
        self._matchers.pop(seq.seq_id, None)
        compiling = self._compiling.pop(seq.seq_id, None)
        if compiling is not None:  # a compile not begun is cancelled; one under way is killed
            compiling[2].cancel()
            compiling[3].set()

    def compile(self, spec: StructuredOutputsParams, skip_special_tokens: bool = True) -> xgr.CompiledGrammar:
        key = self._key(spec, skip_special_tokens)
        if key in self._compiled:
            self._compiled.move_to_end(key)
            return self._compiled[key]
        compiled = self._compile_uncached(spec, skip_special_tokens)
        self._cache(key, compiled)
        return compiled

    def _compile_in_worker(self, spec: StructuredOutputsParams, skip_special_tokens: bool,
                           dropped: threading.Event) -> xgr.CompiledGrammar:
        """On the grammar thread: the compile in the grammar process, its limit counted from when the process took
        it (a grammar queued behind another's is not charged for it, nor the process's start); CompileTimeout past
        the limit."""
        info = self._tokenizer_info(skip_special_tokens)
        try:
            self._worker.start()
        except RuntimeError as e:
            raise ValueError(f"structured_outputs.{spec.kind} could not be compiled: {e}") from None
        kind, text = spec.cache_key
        deadline = time.monotonic() + self.compile_timeout_s
        try:
            compiled = self._worker.compile(skip_special_tokens, info, kind, text, f"structured_outputs.{spec.kind}",
                                            deadline, dropped.is_set)
        except CompileDropped:
            return None  # nobody reads it
        return _xgr().CompiledGrammar.deserialize_json(compiled, info)

    @staticmethod
    def _key(spec: StructuredOutputsParams, skip_special_tokens: bool) -> bytes:
        return spec_hash(*spec.cache_key) + bytes([skip_special_tokens])

    def _compile_uncached(self, spec: StructuredOutputsParams, skip_special_tokens: bool) -> xgr.CompiledGrammar:
        """In this process (compile(): tests, tools); the engine's compiles go to the grammar process."""
        compiler = self._compilers.get(skip_special_tokens)
        if compiler is None:  # its own cache off: compiled grammars are cached here, by spec
            compiler = _xgr().GrammarCompiler(self._tokenizer_info(skip_special_tokens), cache_enabled=False)
            self._compilers[skip_special_tokens] = compiler
        return compile_spec(compiler, *spec.cache_key, f"structured_outputs.{spec.kind}")

    def _cache(self, key: bytes, compiled: xgr.CompiledGrammar) -> None:
        """Least recently used out, down to MAX_CACHED_GRAMMAR_BYTES; a grammar larger than that is not kept."""
        size = compiled.memory_size_bytes
        if size > MAX_CACHED_GRAMMAR_BYTES or key in self._compiled:
            return
        self._compiled[key] = compiled
        self._compiled_bytes += size
        while self._compiled_bytes > MAX_CACHED_GRAMMAR_BYTES:
            _, old = self._compiled.popitem(last=False)
            self._compiled_bytes -= old.memory_size_bytes

    def _tokenizer_info(self, skip_special_tokens: bool) -> xgr.TokenizerInfo:
        info = self._infos.get(skip_special_tokens)
        if info is not None:
            return info
        if self.tokenizer is None:
            raise ValueError("structured_outputs needs the model's tokenizer, and this model has none")
        info = _xgr().TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                  stop_token_ids=self.stop_token_ids or None)
        if skip_special_tokens:
            info = _without_special_tokens(info, self.tokenizer, self.vocab_size)
        self._infos[skip_special_tokens] = info
        return info

    def constrains(self, seqs: list[Sequence]) -> bool:
        return bool(self._matchers) and any(seq.seq_id in self._matchers for seq in seqs)

    def is_constrained(self, seq: Sequence) -> bool:
        return seq.seq_id in self._matchers

    def bitmask(self, seqs: list[Sequence], device: torch.device) -> torch.Tensor:
        """[len(seqs), words] int32 on device, its copy launched: each constrained row's allowed next tokens, every
        bit set in the other rows."""
        rows = [i for i, seq in enumerate(seqs) if seq.seq_id in self._matchers]
        mask = self._host_rows(len(seqs), pinned=device.type == "cuda")
        mask.fill_(-1)
        self._filler = self._filler or _xgr().BatchGrammarMatcher()
        self._filler.batch_fill_next_token_bitmask([self._matchers[seqs[i].seq_id] for i in rows], mask, rows)
        return mask.to(device, non_blocking=True)

    def _host_rows(self, rows: int, pinned: bool) -> torch.Tensor:
        """Rows of one host buffer, kept across steps (a pinned allocation per step costs more than the fill). The
        last step's copy from it is done: the engine read that step's sampled ids, which came after it."""
        if self._host is None or self._host.shape[0] < rows:
            self._host = torch.empty((max(rows, 2 * (0 if self._host is None else self._host.shape[0])),
                                      self.words), dtype=torch.int32, pin_memory=pinned)
        return self._host[:rows]

    def advance(self, seq: Sequence, token: int) -> bool:
        """Feeds seq's new token to its matcher; True when seq's output is complete: its grammar ended, or only a
        stop token may follow. Also True for a token the grammar refuses, which only other constraints that left a
        row nothing the grammar allows can bring about: the output cannot go on."""
        matcher = self._matchers[seq.seq_id]
        if not matcher.accept_token(token):
            logger.warning("request %s: token %d is outside its structured_outputs grammar (other constraints left "
                           "nothing the grammar allows); it ends here", seq.request_id, token)
            return True
        return matcher.is_terminated() or (matcher.is_completed() and self._only_stops_next(matcher))

    def _only_stops_next(self, matcher: xgr.GrammarMatcher) -> bool:
        row = torch.empty((1, self.words), dtype=torch.int32)
        matcher.fill_next_token_bitmask(row)
        allowed = unpack_bitmask(row, self.vocab_size)[0]
        allowed[matcher.stop_token_ids] = False
        return not bool(allowed.any())
