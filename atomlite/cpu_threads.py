"""CPU threads chosen, not inherited. torch's default (one OpenMP thread per core, each spinning while it waits)
made the engine 15-60x slower on a 2-core machine that another process kept busy (LLM.generate of 32 tokens:
4.6-5.8 s against 0.19 s with one thread), and starved the API process beside the engine core. The engine takes
the cores this process may use but one (left to the API process, tokenizing and whatever else runs); the API
process and its parsing process take one each (torch's threads and the tokenizers' Rust pool alike). --cpu-threads,
else OMP_NUM_THREADS, overrides the engine's (vLLM's precedent is VLLM_CPU_OMP_THREADS_BIND)."""
import os


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def engine_threads(requested: int | None = None) -> tuple[int, str]:
    """(threads for the engine, why that many)."""
    cores = usable_cores()
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--cpu-threads {requested}: give at least 1")
        return requested, f"{requested} (--cpu-threads) of {cores} usable cores"
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env), f"{env} (OMP_NUM_THREADS) of {cores} usable cores"
    threads = max(1, cores - 1)
    return threads, (f"{threads} of {cores} usable cores, one left for the rest (--cpu-threads or OMP_NUM_THREADS "
                     f"to choose)")


def use_threads(threads: int) -> None:
    import torch
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def use_one_thread() -> None:
    """For the API process and its helpers: torch's threads and the tokenizers' batch encoding on one thread each
    (TOKENIZERS_PARALLELISM, unless set: its Rust pool takes every core, the engine core's too, while 20,000
    bad_words are tokenized)."""
    use_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
