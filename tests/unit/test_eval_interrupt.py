"""Ctrl-C during `atomlite eval` keeps the jobs already finished: run_jobs stops and says so, the report has them."""
from atomlite.accuracy import runner
from atomlite.accuracy.runner import JobResult, run_jobs, write_report


class Job:
    def __init__(self, name):
        self.name, self.limit = name, None


def test_ctrl_c_keeps_the_finished_jobs_for_the_report(monkeypatch, tmp_path, capsys):
    def fake_run_job(job, *args):
        if job.name == "second":
            raise KeyboardInterrupt
        return JobResult(job.name, "task", "acc", 0.9, 0.5, 0.9, "pass", "ok", 1.0)

    monkeypatch.setattr(runner, "run_job", fake_run_job)
    results, interrupted = run_jobs([Job("first"), Job("second"), Job("third")], tmp_path, tmp_path)
    assert interrupted and [r.job for r in results] == ["first"]
    assert "interrupted: 1 of 3 jobs finished" in capsys.readouterr().out
    write_report(results, tmp_path)
    assert "| first | task | acc | 0.9000 |" in (tmp_path / "report.md").read_text()
