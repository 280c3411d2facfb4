"""The objects a long-running process makes while it starts (imported modules, the model's Python objects, the
tokenizer's tables) live as long as it does. Python's collector still walks all of them in every oldest-generation
collection, which stalls the process: the API server's took 390-406 ms during a 256-request load of the demo model
(2-core CPU), every stream and /health waiting meanwhile."""
import gc


def freeze_startup_heap() -> None:
    """Collects once, then moves every object left to the collector's permanent generation, which it never walks:
    later collections see only what was made since. For a process's own startup (a server, an engine core, a
    worker), not a library caller's process."""
    gc.collect()
    gc.freeze()
