"""The README's serving examples run as written (curl commands and Python snippets that talk to
127.0.0.1:8000) against the demo model served as atomlite-demo, on a free port instead of 8000; the image example
gets the answer the README shows."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from atomlite import LLM
from atomlite.demo import demo_model_dir
from atomlite.server.app import make_app
from server_utils import running

README = Path(__file__).resolve().parents[2] / "README.md"
ADDRESS = "127.0.0.1:8000"


def fenced_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def curl_commands() -> list[str]:
    """Each curl command of the README's bash blocks that calls the server, with its continuation lines."""
    commands = []
    for block in fenced_blocks("bash"):
        for command in re.split(r"(?<!\\)\n", block):
            if command.startswith("curl") and ADDRESS in command:
                commands.append(command.replace("\\\n", " "))
    return commands


def python_snippets() -> list[str]:
    return [block for block in fenced_blocks("python") if ADDRESS in block]


def test_the_readme_stays_short():
    """Detail goes to docs/ (CONTRIBUTING: README.md is for users)."""
    assert len(README.read_text().splitlines()) < 250


def test_the_readme_has_examples_to_run():
    assert len(curl_commands()) >= 3 and len(python_snippets()) >= 2


@pytest.fixture(scope="module")
def base():
    engine = LLM(str(demo_model_dir()), device="cpu", max_model_len=1024).engine
    with running(make_app(engine, "atomlite-demo")) as url:
        yield url


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("index", range(len(curl_commands())))
def test_readme_curl_command_runs(base, index):
    command = curl_commands()[index].replace(f"http://{ADDRESS}", base)
    run = subprocess.run(["bash", "-c", command + " --fail-with-body -sS"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, (command, run.stdout, run.stderr)
    if "data:" in run.stdout:  # a stream: every event parses, and it ends with [DONE]
        events = [line[len("data: "):] for line in run.stdout.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and all("error" not in json.loads(e) for e in events[:-1])
    else:
        assert "choices" in json.loads(run.stdout)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_image_question_gets_the_answer_the_readme_shows(base):
    command = next(c for c in curl_commands() if "image_url" in c).replace(f"http://{ADDRESS}", base)
    shown = re.search(r"^The answer's `content` is `(.+)`$", README.read_text(), flags=re.M).group(1)
    run = subprocess.run(["bash", "-c", command + " --fail-with-body -sS"], capture_output=True, text=True,
                         timeout=120)
    reply = json.loads(run.stdout)
    assert reply["choices"][0]["message"]["content"] == shown, reply
    assert reply["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("index", range(len(python_snippets())))
def test_readme_python_snippet_runs(base, index):
    code = python_snippets()[index].replace(f"http://{ADDRESS}", base)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, (code, run.stderr)
    assert run.stdout.strip()


def test_readme_first_curl_solves_its_question(base):
    """The quick start's curl, on the demo: its arithmetic answered, not text run on to max_tokens."""
    command = curl_commands()[0].replace(f"http://{ADDRESS}", base)
    run = subprocess.run(["bash", "-c", command + " --fail-with-body -sS"], capture_output=True, text=True,
                         timeout=120)
    choice = json.loads(run.stdout)["choices"][0]
    assert "7 + 5 = 12" in choice["text"] and "#### 12" in choice["text"] and choice["finish_reason"] == "stop"


def test_readme_offline_example_runs_on_the_demo():
    [code] = [block for block in fenced_blocks("python") if "from atomlite import LLM" in block]
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=README.parent)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == lines[1] and "7 + 5 = 12" in lines[0] and lines[0].endswith(" stop")  # text = its token ids
    assert len(lines) == 5 and all("Logprob(logprob=" in line and "rank=" in line for line in lines[2:])


@pytest.mark.parametrize("message", ["hi", "What is 7 + 5?", "Name a color.",
                                     "Ben has 4 coins and gets 9 more. How many coins does Ben have now?"])
def test_a_chat_with_the_demo_ends_its_turn(base, message):
    """The README's chats set no max_tokens: the demo's reply ends with its end-of-turn token."""
    from openai import OpenAI
    client = OpenAI(base_url=f"{base}/v1", api_key="unused")
    reply = client.chat.completions.create(model="atomlite-demo", messages=[{"role": "user", "content": message}],
                                           temperature=0)
    assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens <= 64, reply
    assert reply.choices[0].message.content.strip()
