"""Run accuracy jobs: serve the model, point lm-eval (or one of atomlite's own tasks, NATIVE_TASKS) at it, compare
the metric with the job's threshold."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from atomlite.accuracy.catalog import Job
from atomlite.accuracy.vqa import run_vqa

SERVED_NAME = "atomlite-eval"
HEALTH_TIMEOUT_S = 600
# Tasks lm-eval has no form for (images through the chat API): task name -> run(base_url, model, task, limit), which
# returns lm-eval's result shape
NATIVE_TASKS = {"demo_vqa": run_vqa}


@dataclass
class JobResult:
    job: str
    task: str
    metric: str
    score: float | None
    threshold: float | None
    baseline: float | None
    status: str  # pass | fail | error | recorded (no threshold yet)
    detail: str
    seconds: float


def say(message: str) -> None:
    print(f"[atomlite eval] {message}", flush=True)


def render_task(job: Job, catalog_dir: Path, out_dir: Path) -> Path | None:
    """Write the job's task YAML with real paths substituted; None for lm-eval's built-in tasks."""
    source = catalog_dir / "tasks" / f"{job.task}.yaml"
    if not source.exists():
        return None
    _render(source, catalog_dir, out_dir)
    return out_dir


def render_tasks(catalog_dir: Path, out_dir: Path) -> list[str]:
    """Every task YAML of the catalog, rendered into out_dir for `lm_eval --include_path out_dir`; their names."""
    sources = sorted((catalog_dir / "tasks").glob("*.yaml"))
    for source in sources:
        _render(source, catalog_dir, out_dir)
    return [source.stem for source in sources]


def _render(source: Path, catalog_dir: Path, out_dir: Path) -> None:
    """The task file with the installed lm_eval's task folder and the catalog's data folder for its placeholders."""
    import lm_eval
    text = source.read_text().replace("@LM_EVAL_TASKS@", str(Path(lm_eval.__file__).parent / "tasks"))
    text = text.replace("@DATA@", str((catalog_dir / "data").resolve()))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / source.name).write_text(text)


def lm_eval_run(model: str, model_args: dict, job: Job, include_dir: Path | None, limit: int | None) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    manager = TaskManager(include_path=str(include_dir) if include_dir else None,
                          include_defaults=include_dir is None)
    return simple_evaluate(model=model, model_args=model_args, tasks=[job.task], num_fewshot=job.num_fewshot,
                           limit=limit, task_manager=manager, log_samples=True, random_seed=0,
                           numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)


def read_metric(results: dict, job: Job) -> float:
    task_results = results["results"].get(job.task)
    if task_results is None or job.metric not in task_results:
        available = sorted(k for k in (task_results or {}) if not k.endswith("_stderr"))
        raise KeyError(f"metric {job.metric!r} missing from lm-eval's results for {job.task}; has {available}")
    return float(task_results[job.metric])


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, flags: list[str], log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "atomlite.cli", "serve", "--model", str(model), "--port", str(port),
           "--served-model-name", SERVED_NAME, *flags]
    log = open(log_path, "w")
    # a session of its own: Ctrl-C in the terminal reaches this process alone, which then stops the server itself
    # (a server stopped under lm-eval's requests would have them retried, line after line)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        return _wait_healthy(proc, base, log_path)
    except BaseException:  # Ctrl-C while it starts: its own session would keep it running
        stop_server(proc)
        raise


def _wait_healthy(proc: subprocess.Popen, base: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode} before it was healthy; "
                               f"see {log_path}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError(f"the server did not become healthy in {HEALTH_TIMEOUT_S}s; see {log_path}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def judge(score: float, job: Job) -> tuple[str, str]:
    if job.threshold is None:
        return "recorded", f"{job.metric} = {score:.4f} (no threshold recorded yet)"
    if score >= job.threshold:
        return "pass", f"{job.metric} = {score:.4f} >= threshold {job.threshold}"
    return "fail", f"{job.metric} = {score:.4f} < threshold {job.threshold}"


def run_job(job: Job, catalog_dir: Path, report_dir: Path, model: Path | None = None,
            limit: int | None = None) -> JobResult:
    started = time.monotonic()
    model = model or job.model_path()
    report_dir.mkdir(parents=True, exist_ok=True)
    native = NATIVE_TASKS.get(job.task)
    include_dir = None if native else render_task(job, catalog_dir, Path(tempfile.mkdtemp(prefix="atomlite-tasks-")))
    say(f"{job.name}: serving {model} ...")
    score, status, detail = None, "error", ""
    try:
        proc, base = start_server(model, job.serve_flags, report_dir / f"{job.name}.server.log")
    except RuntimeError as e:
        return JobResult(job.name, job.task, job.metric, None, job.threshold, job.baseline, "error", str(e),
                         time.monotonic() - started)
    try:
        shots = [] if job.num_fewshot is None else [f"{job.num_fewshot}-shot"]
        details = ", ".join(shots + ([f"limit {limit}"] if limit else []))
        say(f"{job.name}: server healthy at {base}; running {'' if native else 'lm-eval '}task {job.task}"
            f"{f' ({details})' if details else ''}")
        if native:
            results = native(base, SERVED_NAME, job.task, limit)
        else:
            args = {"base_url": f"{base}/v1/completions", "model": SERVED_NAME, "tokenizer_backend": "remote",
                    "num_concurrent": 16, "max_retries": 1, "timeout": 600}
            results = lm_eval_run("local-completions", args, job, include_dir, limit)
        write_samples(results, job, report_dir / f"{job.name}.samples.jsonl")
        score = read_metric(results, job)
        status, detail = judge(score, job)
    except Exception as e:  # noqa: BLE001 - any failure is this job's error, reported, never a pass
        detail = f"{type(e).__name__}: {e}"
    finally:
        stop_server(proc)
    say(f"{job.name}: {status.upper()} - {detail}")
    return JobResult(job.name, job.task, job.metric, score, job.threshold, job.baseline, status, detail,
                     time.monotonic() - started)


def run_jobs(jobs: list[Job], catalog_dir: Path, report_dir: Path, model: Path | None = None,
             limit: int | None = None) -> tuple[list[JobResult], bool]:
    """(each job's result, whether Ctrl-C stopped the run): an interrupted job's server is stopped, and the jobs
    finished before it keep their results for the report."""
    results = []
    try:
        for i, job in enumerate(jobs, 1):
            say(f"job {i}/{len(jobs)}: {job.name}")
            results.append(run_job(job, catalog_dir, report_dir, model, limit or job.limit))
    except KeyboardInterrupt:
        say(f"interrupted: {len(results)} of {len(jobs)} jobs finished; their report follows")
        return results, True
    return results, False


def write_samples(results: dict, job: Job, path: Path) -> None:
    with open(path, "w") as f:
        for sample in results.get("samples", {}).get(job.task, []):
            f.write(json.dumps(sample, default=str) + "\n")


def write_report(results: list[JobResult], report_dir: Path) -> None:
    (report_dir / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    lines = ["| job | task | metric | score | threshold | baseline | status | time |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        score = "-" if r.score is None else f"{r.score:.4f}"
        lines.append(f"| {r.job} | {r.task} | {r.metric} | {score} | {r.threshold} | {r.baseline} | "
                     f"{r.status} | {r.seconds:.0f}s |")
    (report_dir / "report.md").write_text("\n".join(lines) + "\n")
