"""`atomlite eval`: the accuracy jobs (lm-eval against `atomlite serve`, gated on the catalog's thresholds)."""
import sys
from pathlib import Path

import click

from atomlite.commands.options import fail
from atomlite.errors import ConfigError


@click.command(name="eval")
@click.argument("jobs", nargs=-1)
@click.option("--all", "run_all", is_flag=True, help="Run every job of the catalog (filtered by --level).")
@click.option("--level", type=click.Choice(["pr", "nightly"]), default=None, help="Only jobs of this level.")
@click.option("--catalog", type=click.Path(path_type=Path), default=None,
              help="Job catalog (default: ci/accuracy/catalog.yaml of this checkout).")
@click.option("--report-dir", type=click.Path(path_type=Path), default=Path("accuracy-report"), show_default=True,
              help="Where results.json, report.md, server logs and per-sample records go.")
@click.option("--model", "model", type=click.Path(path_type=Path), default=None,
              help="Run the jobs on this checkpoint instead of the catalog's (e.g. a candidate build).")
@click.option("--limit", type=int, default=None, help="Score only the first N samples of each task.")
@click.option("--write-tasks", type=click.Path(path_type=Path), default=None,
              help="Only write the catalog's task files, ready for `lm_eval --include_path DIR`, and exit.")
def eval_command(jobs, run_all, level, catalog, report_dir, model, limit, write_tasks):
    """Accuracy jobs: serve the model, run lm-eval on it, compare with the catalog's thresholds.

    Exits non-zero when a job scores below its threshold, its metric is missing, or it fails to run."""
    try:
        from atomlite.accuracy.catalog import REPO_CI, load_catalog, select
        from atomlite.accuracy.runner import render_tasks, run_jobs, write_report
        import lm_eval  # noqa: F401
    except ImportError as e:
        fail(f"accuracy jobs need the eval extra: pip install 'atomlite[eval,serve]' ({e.name} is missing)")
    catalog = catalog or REPO_CI / "catalog.yaml"
    if write_tasks is not None:
        names = render_tasks(catalog.parent, write_tasks)
        click.echo(f"wrote {', '.join(names)} to {write_tasks}; run e.g.\n  lm_eval --model local-completions "
                   f"--model_args base_url=http://127.0.0.1:8000/v1/completions,model=atomlite-demo,"
                   f"tokenizer_backend=remote --include_path {write_tasks} --tasks {names[0]} --limit 5")
        return
    try:
        selected = select(load_catalog(catalog), jobs, run_all, level)
    except ConfigError as e:
        fail(str(e))
    results, interrupted = run_jobs(selected, catalog.parent, report_dir, model, limit)
    write_report(results, report_dir)
    click.echo((report_dir / "report.md").read_text())
    sys.exit(130 if interrupted else 0 if all(r.status in ("pass", "recorded") for r in results) else 1)
