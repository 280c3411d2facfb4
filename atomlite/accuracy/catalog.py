"""The job catalog: which model, served how, scored on which task by which metric, against what threshold."""
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from atomlite.errors import ConfigError

REPO_CI = Path(__file__).resolve().parents[2] / "ci" / "accuracy"
LEVELS = ("pr", "nightly")


@dataclass
class Job:
    name: str
    model: str
    task: str
    metric: str
    level: str
    num_fewshot: int | None = None
    serve_flags: list[str] = field(default_factory=list)
    baseline: float | None = None
    threshold: float | None = None
    limit: int | None = None

    def model_path(self) -> Path:
        if self.model == "demo":
            from atomlite.demo import demo_model_dir
            return demo_model_dir()
        return Path(self.model)


def load_catalog(path: Path) -> list[Job]:
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no job catalog at {path}: pass --catalog ci/accuracy/catalog.yaml") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("jobs", []), list):
        raise ConfigError(f"{path}: a job catalog is a mapping with a list under 'jobs:'")
    jobs = []
    for entry in raw.get("jobs", []):
        try:
            job = Job(**entry)
        except TypeError as e:
            raise ConfigError(f"{path}: job {entry.get('name', '?')}: {e}") from None
        if job.level not in LEVELS:
            raise ConfigError(f"{path}: job {job.name}: level {job.level!r} is not one of {', '.join(LEVELS)}")
        jobs.append(job)
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: job names must be unique")
    return jobs


def select(jobs: list[Job], names: tuple[str, ...], run_all: bool, level: str | None) -> list[Job]:
    if names:
        known = {j.name: j for j in jobs}
        missing = [n for n in names if n not in known]
        if missing:
            raise ConfigError(f"unknown job(s) {', '.join(missing)}; the catalog has: {', '.join(known)}")
        return [known[n] for n in names]
    if not run_all:
        raise ConfigError("name one or more jobs, or pass --all (with --level pr|nightly to filter)")
    return [j for j in jobs if level is None or j.level == level]
