"""Nothing left running, no request cut: the engine core stops with its API process however that dies (SIGKILL
included) and removes its socket folder; a second SIGTERM ends the requests in flight with an error event and
[DONE] (streams) or an OpenAI-shaped 503 (the rest). Real `atomlite serve` processes."""
import os
import re
import signal
import threading
import time

import httpx
import pytest

from atomlite.accuracy.runner import SERVED_NAME, start_server

LONG = {"model": SERVED_NAME, "prompt": "Hi", "max_tokens": 480, "ignore_eos": True}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited: only its parent has not read its status yet
        return f.read().split()[2] != "Z"


def core_pid(log) -> int:
    return int(re.search(r"engine core: process (\d+)", log.read_text()).group(1))


def children(pid: int) -> list[int]:
    found = []
    for stat in os.listdir("/proc"):
        try:
            with open(f"/proc/{stat}/stat") as f:
                if stat.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(stat))
        except (OSError, IndexError, ValueError):
            continue
    return found


def test_the_engine_core_and_its_grammar_process_die_with_a_killed_api_process(random_model_dir, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    log = tmp_path / "server.log"
    proc, base = start_server(random_model_dir, ["--dtype", "float32", "--max-model-len", "512"], log)
    try:
        core = core_pid(log)
        assert [p.name for p in tmp_path.glob("atomlite-*")], "the core's socket folder is in TMPDIR"
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
        resp = httpx.post(f"{base}/v1/completions", timeout=120, json={
            "model": SERVED_NAME, "prompt": "Hi", "max_tokens": 40, "structured_outputs": {"json": schema}})
        assert resp.status_code == 200, resp.text  # compiled in the grammar process, a child of the core
        grammar = children(core)
        assert grammar, "the grammar process runs beside the core"
        with httpx.stream("POST", f"{base}/v1/completions", json={**LONG, "stream": True}, timeout=60) as r:
            assert next(r.iter_lines()).startswith("data:")  # the core is busy stepping
            proc.kill()
            proc.wait(10)
        deadline = time.monotonic() + 10
        while (alive(core) or any(map(alive, grammar))) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(core), "the engine core outlived its API process"
        assert not any(map(alive, grammar)), "the grammar process outlived the engine core"
        assert not list(tmp_path.glob("atomlite-*"))
    finally:
        proc.kill()


def test_a_second_sigterm_ends_streams_with_an_error_and_others_with_a_503(random_model_dir, tmp_path):
    log = tmp_path / "server.log"
    proc, base = start_server(random_model_dir, ["--dtype", "float32", "--max-model-len", "512",
                                                 "--max-num-seqs", "1"], log)
    try:
        plain = {}

        def non_streamed():
            plain["resp"] = httpx.post(f"{base}/v1/completions", json=LONG, timeout=60)

        thread = threading.Thread(target=non_streamed)
        with httpx.stream("POST", f"{base}/v1/completions", json={**LONG, "stream": True}, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data:")
            thread.start()
            time.sleep(0.3)  # the second request is in flight (waiting: one sequence at a time)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        thread.join(30)
        assert rest[-1] == "data: [DONE]" and '"error"' in rest[-2] and "second signal" in rest[-2], rest[-2:]
        resp = plain["resp"]
        assert resp.status_code == 503 and resp.json()["error"]["type"] == "service_unavailable", resp.text
        assert proc.wait(30) == 0
        assert "Traceback" not in log.read_text()
    finally:
        proc.kill()
