"""CPU threads are chosen, not inherited: the engine takes the usable cores but one unless --cpu-threads or
OMP_NUM_THREADS says otherwise, and says which; a bench far over its roofline says what to check."""
import os

import pytest
import torch

from atomlite.benchmarks.offline import format_table, row
from atomlite.cpu_threads import engine_threads, usable_cores


def test_the_default_leaves_one_core_for_the_rest(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads, note = engine_threads()
    assert threads == max(1, len(os.sched_getaffinity(0)) - 1) and "one left" in note


def test_the_flag_wins_over_the_environment_which_wins_over_the_default(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert engine_threads(5) == (5, f"5 (--cpu-threads) of {usable_cores()} usable cores")
    assert engine_threads()[0] == 3 and "OMP_NUM_THREADS" in engine_threads()[1]
    with pytest.raises(ValueError, match="--cpu-threads 0"):
        engine_threads(0)


def test_the_engine_sets_its_threads_and_says_so(random_model_dir):
    from atomlite import LLM
    before = torch.get_num_threads()
    try:
        llm = LLM(str(random_model_dir), dtype="float32", device="cpu", max_model_len=64, cpu_threads=1)
        assert torch.get_num_threads() == 1
        assert "CPU threads: 1 (--cpu-threads)" in "\n".join(llm.engine.describe())
    finally:
        torch.set_num_threads(before)


def test_a_result_far_over_its_roofline_says_what_to_check():
    sane = format_table([row("decode", 0.010, 0.001, "weights")])
    absurd = format_table([row("decode", 0.159, 0.001, "weights")])
    assert not any(line.startswith("warning") for line in sane)
    assert absurd[-1].startswith("warning: 159x the roofline") and "--cpu-threads" in absurd[-1]


def test_the_body_parsing_process_takes_one_thread_at_a_lower_priority(monkeypatch):
    """It parses large bodies beside the engine core: torch and the tokenizers' pool on one thread, and the core
    first when both want a core."""
    from atomlite.server.body_parsing import PARSER_NICENESS, BodyParser
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    parser = BodyParser()
    parser.start()
    try:
        parser.wait_ready()
        (pid,) = parser.pool._processes
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + PARSER_NICENESS)
        assert parser.pool.submit(os.getenv, "TOKENIZERS_PARALLELISM").result() == "false"
        assert parser.pool.submit(torch.get_num_threads).result() == 1
    finally:
        parser.stop()


def test_one_thread_leaves_a_chosen_tokenizers_parallelism_alone(monkeypatch):
    from atomlite.cpu_threads import use_one_thread
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
        use_one_thread()
        assert torch.get_num_threads() == 1 and os.environ["TOKENIZERS_PARALLELISM"] == "true"
        monkeypatch.delenv("TOKENIZERS_PARALLELISM")
        use_one_thread()
        assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    finally:
        torch.set_num_threads(before)
