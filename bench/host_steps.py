"""Host time per engine step while streaming a long answer: it must not grow with the answer's length.

    PYTHONPATH=. python bench/host_steps.py [--tokens 4096 --batches 1 32 --window 256 --forward stub|model]

Streams --tokens tokens per request (ignore_eos, a stop string that never matches) through the AsyncEngine, as
the server does, with the bundled demo model (char tokenizer: every token is text) on the CPU, its engine core on a
thread. Each engine step (schedule, runner input preparation, forward, sampling, token stop checks, the updates)
is timed, and so are the runner's execute() and, inside it, the model's forward. Prints milliseconds per step
(first quartile) over the first and the last --window decode steps: host = step - forward (everything but the
model's compute), the runner's input preparation (execute - forward), and step - execute.

--forward stub (the default) replaces the model's forward by zeros (the logits stay real): on a GPU the forward
runs on the device, while a CPU forward over a growing context also evicts the host code's data from the caches
and makes all host work look slower at the end. --forward model runs the real model.
"""
import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from atomlite import SamplingParams
from atomlite.config import EngineConfig
from atomlite.demo import demo_model_dir
from atomlite.engine.ipc.async_engine import AsyncEngine
from atomlite.engine.llm_engine import LLMEngine


class Stopwatch:
    """Wraps a callable; adds its duration to the current step's entry under `name`."""

    def __init__(self, steps: list[dict], name: str, fn):
        self.steps, self.name, self.fn = steps, name, fn

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            if self.steps:
                entry = self.steps[-1]
                entry[self.name] = entry.get(self.name, 0.0) + time.perf_counter() - start


class TimedModel:
    """The model as the runner sees it, with its forward and logits timed as `forward`."""

    def __init__(self, model, steps: list[dict]):
        self._model = model
        self._call = Stopwatch(steps, "forward", model)
        self.compute_logits = Stopwatch(steps, "forward", model.compute_logits)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._model, name)


class StubModel(TimedModel):
    """The model with its layers skipped: zero hidden states, real logits (the sampler needs them)."""

    def __init__(self, model, steps: list[dict], hidden_size: int):
        super().__init__(model, steps)
        self._call = Stopwatch(steps, "forward", lambda ids, ctx: torch.zeros(len(ids), hidden_size))


def long_context_demo_model(root: Path, max_positions: int) -> Path:
    """The demo model with room for a long answer (its positions are rotary: no weights depend on the limit)."""
    path = root / "demo"
    shutil.copytree(demo_model_dir(), path)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = max_positions
    (path / "config.json").write_text(json.dumps(config))
    return path


def instrument(engine: LLMEngine, stub: bool) -> list[dict]:
    steps: list[dict] = []
    step = engine.step

    def timed_step():
        steps.append({"step": 0.0, "execute": 0.0, "forward": 0.0, "running": len(engine.scheduler.running)})
        start = time.perf_counter()
        updates = step()
        steps[-1]["step"] = time.perf_counter() - start
        return updates

    engine.step = timed_step
    runner = engine.runner
    runner.execute = Stopwatch(steps, "execute", runner.execute)
    hidden_size = engine.config.model_spec.hf["hidden_size"]
    runner.model = StubModel(runner.model, steps, hidden_size) if stub else TimedModel(runner.model, steps)
    return steps


async def stream_all(engine: AsyncEngine, batch: int, tokens: int) -> list[str]:
    params = SamplingParams(temperature=0.8, seed=0, max_tokens=tokens, ignore_eos=True, stop=["\x00never"])

    async def one(i: int) -> str:
        engine.admit(1)
        async with contextlib.aclosing(engine.generate(f"r{i}", [2] + [40 + i % 50] * 8, params)) as gen:
            return "".join([delta.text async for delta in gen])

    return await asyncio.gather(*(one(i) for i in range(batch)))


def measure(path: Path, batch: int, tokens: int, stub: bool) -> tuple[list[dict], list[str]]:
    config = EngineConfig(model=str(path), dtype="float32", device="cpu", max_model_len=tokens + 64,
                          max_num_seqs=batch, enable_prefix_caching=False, kv_cache_memory=2**30)
    llm_engine = LLMEngine(config)
    steps = instrument(llm_engine, stub)
    engine = AsyncEngine.over(llm_engine)
    engine.start()
    try:
        texts = asyncio.run(stream_all(engine, batch, tokens))
    finally:
        engine.shutdown()
    return [s for s in steps if s["running"] == batch], texts


def quartile_ms(steps: list[dict], key) -> float:
    """The first quartile: other processes on a shared machine only ever add time, and the median moves with them."""
    return 1e3 * statistics.quantiles([key(s) for s in steps], n=4)[0]


def report(batch: int, steps: list[dict], window: int) -> None:
    decode = steps[1:]  # the first one is the prefill
    print(f"batch {batch}: {len(decode)} decode steps")
    columns = {"host (step - forward)": lambda s: s["step"] - s["forward"],
               "  runner input prep": lambda s: s["execute"] - s["forward"],
               "  step - execute": lambda s: s["step"] - s["execute"],
               "forward": lambda s: s["forward"]}
    for name, key in columns.items():
        start, end = quartile_ms(decode[:window], key), quartile_ms(decode[-window:], key)
        print(f"  {name:22s} start {start:7.3f} ms   end {end:7.3f} ms   end/start {end / start:5.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--forward", choices=["stub", "model"], default="stub")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        path = long_context_demo_model(Path(root), args.tokens + 64)
        for batch in args.batches:
            steps, texts = measure(path, batch, args.tokens, args.forward == "stub")
            assert all(len(t) > 0 for t in texts)
            report(batch, steps, args.window)


if __name__ == "__main__":
    main()
