"""torchrun's documented command lines, run verbatim with ``torchrun`` replaced by ``python -m npu_migrate.launch``.

The examples are read from the installed torch's own documentation (the module docstring of
``torch/distributed/run.py``, the page https://docs.pytorch.org/docs/stable/elastic/run.html is
built from), so this test follows torch's docs as they change. Each example runs as written,
with the shell's variables filled in (``$NUM_TRAINERS`` 2, ``$NUM_NODES`` 2, ``$JOB_ID``,
``$HOST_NODE_ADDR`` 127.0.0.1 and a free port) and its script replaced by a stand-in that
records what each rank saw; the script's own arguments stay the docs' words. How each runs:

* one node (``--standalone``, ``--rdzv-endpoint=localhost:0``, ``--numa-binding``): a real job;
* several fixed nodes with a c10d ``--rdzv-endpoint`` (the fault-tolerant example): one launcher per
  node on 127.0.0.1, node ranks assigned by the rendezvous;
* an elastic range (``--nnodes=1:4``, which waits ``last_call_timeout`` for more nodes) and a
  static rendezvous without ``--node-rank`` (the logging example, where every launcher would be
  node 0, as under torchrun): checked with ``--dry-run`` (the world, the target, the flags);
* ``--print-completion``: the completion script, or torchrun's line naming shtab where it is missing.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LAUNCH_SCRIPTS, ROOT, child_env, free_port
from npu_migrate.launch.cli import build_parser
from support import Launch

SCRIPT = LAUNCH_SCRIPTS / "torchrun_job.py"
LAUNCHER = [sys.executable, "-m", "npu_migrate.launch"]


def _documented() -> list[tuple[str, str]]:
    """Every ``torchrun ...`` command in torch.distributed.run's docstring: (section title, command text)."""
    import torch.distributed.run as run

    lines = (run.__doc__ or "").splitlines()
    found, section = [], ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if i + 1 < len(lines) and lines[i + 1] and set(lines[i + 1]) <= set("-+=~^") and line.strip():
            section = line.strip()
        stripped = line.strip()
        if stripped.startswith("torchrun") and line.startswith(" "):  # inside a literal block
            indent = len(line) - len(line.lstrip())
            text = [stripped]
            while i + 1 < len(lines) and lines[i + 1].strip() and (
                    text[-1].endswith("\\") or len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent):
                i += 1
                text[-1] = text[-1].rstrip("\\").rstrip()
                text.append(lines[i].strip())
            found.append((section, " ".join(text)))
        i += 1
    return found


EXAMPLES = _documented()


def test_the_docs_have_the_examples_this_test_runs() -> None:
    """The extraction finds torch's usage examples (an empty list would pass anything)."""
    commands = " | ".join(text for _, text in EXAMPLES)
    assert len(EXAMPLES) >= 4, EXAMPLES  # torch 2.7's docs have four; 2.14's add NUMA binding
    for flag in ("--standalone", "--rdzv-endpoint", "--nnodes=1:4", "--max-restarts=3"):
        assert flag in commands


def _argv(text: str, values: dict[str, str]) -> tuple[list[str], str | None]:
    """The example's words, the shell's variables filled in; and where its stdout is redirected, if anywhere."""
    def fill(match: re.Match) -> str:
        assert match.group(1) in values, f"torch's docs use ${match.group(1)}: give it a value in this test"
        return values[match.group(1)]

    words = shlex.split(re.sub(r"\$([A-Z_]+)\b", fill, text))
    redirect = None
    if ">" in words:
        at = words.index(">")
        words, redirect = words[:at], words[at + 1]
    assert words[0] == "torchrun", words
    return words[1:], redirect


def _value(words: list[str], flag: str) -> str | None:
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def _mode(words: list[str]) -> str:
    if any(w.startswith("--print-completion") for w in words):
        return "completion"
    low, _, high = (_value(words, "--nnodes") or "1").partition(":")
    high = high or low
    if high == "1":
        return "one node"
    if low == high and _value(words, "--rdzv-endpoint") and _value(words, "--rdzv-backend") == "c10d":
        return "nodes"
    return "dry-run"


def _with_script(words: list[str]) -> tuple[list[str], list[str]]:
    """The launcher's words with the stand-in for the docs' script; and the script's own arguments (the docs')."""
    at = next(i for i, w in enumerate(words) if w.endswith(".py"))
    return [*words[:at], str(SCRIPT), *words[at + 1:]], words[at + 1:]


def _reports(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("torchrun-rank*-attempt0.json"),
                                                       key=lambda p: int(p.name.split("-")[1][4:]))]


@pytest.mark.slow
@pytest.mark.parametrize("section,text", EXAMPLES, ids=[f"{s[:40]}: {t[:60]}" for s, t in EXAMPLES])
def test_torchruns_documented_command_line_runs_as_documented(tmp_path: Path, section: str, text: str) -> None:
    port = free_port()
    values = {"NUM_TRAINERS": "2", "NUM_NODES": "2", "JOB_ID": f"docs{port}", "HOST_NODE_ADDR": f"127.0.0.1:{port}"}
    words, redirect = _argv(text, values)
    options = build_parser()._option_string_actions
    missing = [w.split("=")[0] for w in words if w.startswith("--rdzv") and w.split("=")[0] not in options]
    if missing:
        pytest.skip(f"{missing[0]} comes with the launcher's rendezvous flags")
    mode = _mode(words)
    if mode == "completion":
        result = subprocess.run([*LAUNCHER, *words], env=child_env(), cwd=ROOT, capture_output=True, text=True,
                                timeout=60)
        try:
            import shtab  # noqa: F401
        except ImportError:
            assert (result.returncode, result.stderr.strip()) == (
                1, f"{words[0].split('=')[0]} requires the 'shtab' package: pip install shtab"), result.stderr
        else:
            assert result.returncode == 0 and "npu_migrate" in result.stdout and redirect
        return
    launcher, script_args = _with_script(words)
    if mode == "dry-run":
        result = subprocess.run([*LAUNCHER, "--dry-run", *launcher], env=child_env(OUT_DIR=str(tmp_path)), cwd=ROOT,
                                capture_output=True, text=True, timeout=90)
        assert result.returncode == 0, result.stderr
        nodes = (_value(words, "--nnodes") or "1").split(":")[-1]
        nproc = _value(words, "--nproc-per-node")
        assert re.search(rf"world: (\d+ to )?{nodes} node\(s\) x {nproc} process\(es\)", result.stdout), result.stdout
        assert f"target: {shlex.join([str(SCRIPT), *script_args])}" in result.stdout
        return
    nodes = 1 if mode == "one node" else int(_value(words, "--nnodes") or 1)
    jobs = [Launch(tmp_path, *launcher, name=f"node{k}") for k in range(nodes)]
    for job in jobs:
        assert job.wait() == 0, job.err
    nproc = int(_value(words, "--nproc-per-node") or 1)
    got = _reports(tmp_path)
    world = nodes * nproc
    assert [r["env"]["RANK"] for r in got] == [str(r) for r in range(world)]
    for r in got:
        assert r["argv"] == [str(SCRIPT), *script_args]  # the docs' own arguments reach the script untouched
        assert r["env"]["WORLD_SIZE"] == str(world) and r["env"]["LOCAL_WORLD_SIZE"] == str(nproc)
        assert r["sum"] == world * (world + 1) / 2
    if _value(words, "--rdzv-id"):
        assert {r["env"]["TORCHELASTIC_RUN_ID"] for r in got} == {values["JOB_ID"]}
    if _value(words, "--max-restarts"):
        assert {r["env"]["TORCHELASTIC_MAX_RESTARTS"] for r in got} == {_value(words, "--max-restarts")}
