"""vLLM's command names: `atomlite serve MODEL` (positional), `--no-enable-prefix-caching`, `GET /v1/models/{id}`."""
import signal
import subprocess
import sys
import time

import httpx
from click.testing import CliRunner

from atomlite.accuracy.runner import free_port
from atomlite.cli import main
from atomlite.demo import demo_model_dir


def test_serve_takes_the_model_positionally_and_answers_model_by_id(tmp_path):
    port = free_port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "atomlite.cli", "serve", str(demo_model_dir()), "--port", str(port),
                             "--max-model-len", "256", "--no-enable-prefix-caching"], stdout=log,
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert proc.poll() is None, (tmp_path / "server.log").read_text()
        card = httpx.get(f"{base}/v1/models/atomlite-demo")
        assert card.status_code == 200 and card.json()["id"] == "atomlite-demo"
        other = httpx.get(f"{base}/v1/models/other")
        assert other.status_code == 404 and "atomlite-demo" in other.json()["error"]["message"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_two_different_models_are_one_line_naming_both():
    result = CliRunner().invoke(main, ["serve", "a-folder", "--model", "another", "--port", str(free_port())])
    assert result.exit_code == 2 and "two models given (a-folder and --model another)" in result.output


def test_vllm_and_atomlite_names_for_no_prefix_caching_both_work():
    for flag in ("--no-enable-prefix-caching", "--no-prefix-caching"):
        result = CliRunner().invoke(main, ["generate", "--model", str(demo_model_dir()), flag, "--max-tokens", "1",
                                           "Hi"])
        assert result.exit_code == 0, result.output


def test_plan_takes_no_flag_that_only_changes_how_steps_run():
    for flag in ("--enforce-eager", "--no-overlap-decode", "--no-enable-prefix-caching"):
        result = CliRunner().invoke(main, ["plan", "--model", str(demo_model_dir()), flag])
        assert result.exit_code == 2 and "No such option" in result.output, result.output


def test_verbose_works_before_or_after_the_command():
    for args in (["-v", "plan", "--model", str(demo_model_dir())], ["plan", "--model", str(demo_model_dir()), "-v"],
                 ["plan", "--model", str(demo_model_dir())]):
        run = subprocess.run([sys.executable, "-m", "atomlite.cli", *args], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert ("atomlite.dispatch: kernel" in run.stderr) == ("-v" in args), args


def test_every_flag_of_every_command_has_help():
    import click

    def commands(cmd, path):
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from commands(sub, path + [name])
        else:
            yield " ".join(path), cmd

    for path, cmd in commands(main, []):
        missing = [p.opts[0] for p in cmd.params if isinstance(p, click.Option) and not p.help]
        assert not missing, f"atomlite {path}: {missing} have no help"


def test_multimodal_flags_take_vllms_names_and_a_bad_value_names_its_flag():
    for flag, value, needle in (("--limit-mm-per-prompt", '{"smell": 1}', "--limit-mm-per-prompt: 'smell'"),
                                ("--limit-mm-per-prompt", "image=2", "--limit-mm-per-prompt: not JSON"),
                                ("--mm-processor-kwargs", '{"max_soft_tokens": 99}',
                                 "--mm-processor-kwargs.max_soft_tokens: 99 is not one of"),
                                ("--allowed-local-media-path", "relative/dir", "--allowed-local-media-path"),
                                ("--allowed-media-domains", "https://a.com", "host names alone")):
        result = CliRunner().invoke(main, ["serve", str(demo_model_dir()), "--port", str(free_port()), flag, value])
        assert result.exit_code == 2 and needle in result.output, result.output
