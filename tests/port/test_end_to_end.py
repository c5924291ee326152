"""Ported CUDA scripts run on CPU, and the seeds' code blocks port to code that compiles.

The scripts in scripts/ are CUDA-only as users write them. They are ported into tmp_path
(the CLI, as a user runs it) and run without --migrate: the torchrun styles with 2 ranks (torchrun's
variables from the launcher, without --migrate; cuda_ordinals.py names its device by integer
ordinal everywhere torch takes one), the mp.spawn style by running the
script itself, as two "nodes" of one worker each (nm.device_count() is 1 on CPU).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from port.marks import torch_style_runs
from conftest import child_env, free_port, run_cli, run_ranks
from npu_migrate.port import port_source

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
from port.seeds import SEEDS  # noqa: E402 - ../shared/seeds next to the repository

LEFTOVERS = ("torch.cuda", ".cuda(", "nccl")


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ported")
    result = run_cli("port", str(SCRIPTS), "--out", str(out))
    assert result.returncode == 0, result.stderr
    for script in ("cuda_torchrun.py", "cuda_spawn.py", "cuda_ordinals.py"):
        text = (out / script).read_text()
        for leftover in LEFTOVERS:
            assert leftover not in text, f"{script} still has {leftover!r}:\n{text}"
        assert "import npu_migrate as nm" in text
    return out


def _params(reports: list[dict]) -> list:
    return [r["params"] for r in reports]


@pytest.mark.slow
def test_torchrun_style_script_runs_on_cpu_with_two_ranks(ported: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "npu_migrate.launch", "--device-num", "2", str(ported / "cuda_torchrun.py")],
        env=child_env(OUT_DIR=str(tmp_path)), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "2 process(es) on cpu with gloo" in result.stderr and "migrated" not in result.stderr  # no --migrate
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in reports] == [0, 1]
    assert {r["device"] for r in reports} == {"cpu"}
    first, second = _params(reports)
    assert first == second  # DDP kept the ranks in step


def _check_ordinal_reports(reports: list[dict]) -> None:
    """What scripts/cuda_ordinals.py computed on 2 ranks: every tensor on the CPU, the collectives and
    the checkpoint right."""
    assert [r["rank"] for r in reports] == [0, 1]
    for report in reports:
        assert report["devices"] == ["cpu"]
        assert report["total"] == report["loaded"] == [1.0, 2.0, 3.0, 4.0]  # all_reduce of the ranks, + arange
        assert report["gathered"] == [0, 10]
        assert report["layer"] == [2] and report["blank"] == [0.0, 0.0]
    assert reports[0]["noise"] == reports[1]["noise"]  # the same seeded generator on each rank


@pytest.mark.slow
def test_integer_device_ordinals_run_on_two_cpu_ranks(ported: Path, tmp_path: Path) -> None:
    """device=local_rank, torch.device(local_rank), map_location=local_rank...: CUDA ordinals, ported."""
    result = subprocess.run(
        [sys.executable, "-m", "npu_migrate.launch", "--device", "cpu", "--device-num", "2",
         str(ported / "cuda_ordinals.py")],
        env=child_env(OUT_DIR=str(tmp_path)), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "NVIDIA" not in result.stderr
    _check_ordinal_reports([json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)])


@pytest.mark.slow
def test_spawn_style_script_runs_itself_on_cpu(ported: Path, tmp_path: Path) -> None:
    port = str(free_port())
    nodes = [
        subprocess.Popen(
            [sys.executable, str(ported / "cuda_spawn.py"), "--world-size", "2", "--rank", str(node),
             "--port", port, "--out-dir", str(tmp_path)],
            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for node in (0, 1)
    ]
    try:
        logs = [proc.communicate(timeout=120)[0] for proc in nodes]
    finally:
        for proc in nodes:
            if proc.poll() is None:
                proc.kill()
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(logs)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert {r["world_size"] for r in reports} == {2}  # one worker per node: nm.device_count() == 1
    first, second = _params(reports)
    assert first == second


@pytest.mark.slow
@torch_style_runs
def test_torch_style_port_of_the_torchrun_script_runs_on_cpu(tmp_path: Path) -> None:
    source = (SCRIPTS / "cuda_torchrun.py").read_text()
    script = tmp_path / "plain_torch.py"
    script.write_text(port_source(source, style="torch").code)
    text = script.read_text()
    assert "npu_migrate" not in text and not any(leftover in text for leftover in LEFTOVERS)
    out = tmp_path / "out"
    out.mkdir()
    first, second = _params(run_ranks(script, 2, out))
    assert first == second


@pytest.mark.slow
@torch_style_runs
def test_torch_style_port_of_integer_device_ordinals_runs_on_cpu(tmp_path: Path) -> None:
    script = tmp_path / "plain_torch.py"
    script.write_text(port_source((SCRIPTS / "cuda_ordinals.py").read_text(), style="torch").code)
    code = script.read_text().split('"""', 2)[2]  # after the docstring, which names the forms
    assert "npu_migrate" not in code and "device=local_rank" not in code and "map_location=local_rank" not in code
    out = tmp_path / "out"
    out.mkdir()
    _check_ordinal_reports(run_ranks(script, 2, out))


# --------------------------------------------------------------------------- seeds

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_CELL = re.compile(r"^In \[[^\]]*\]:\n(.*?)(?=^In \[|^## |\Z)", re.S | re.M)


def _tab_blocks(text: str) -> list[str]:
    """Code indented with a tab in prose; it goes on over indented lines until prose starts again."""
    blocks, current = [], None
    for line in text.splitlines():
        stripped = line.strip()
        if line.startswith("\t"):
            current = current if current is not None else []
            current.append(line[1:])
        elif current is not None and (not stripped or (line[:1] == " " and stripped.isascii()
                                                         and not re.match(r"[（(]?\d+[).、）]", stripped))):
            current.append(line)
        elif current is not None:
            blocks.append("\n".join(current))
            current = None
    if current is not None:
        blocks.append("\n".join(current))
    return blocks


def seed_blocks() -> list:
    params = []
    for seed in sorted(SEEDS.glob("*.txt")) if SEEDS.is_dir() else []:
        text = seed.read_text(encoding="utf-8")
        blocks = _FENCE.findall(text) + _CELL.findall(text) + _tab_blocks(_FENCE.sub("", text))
        for i, block in enumerate(blocks):
            code = textwrap.dedent(block).strip("\n") + "\n"
            if code.strip():
                params.append(pytest.param(code, id=f"{seed.stem[:3]}-{i}"))
    return params


BLOCKS = seed_blocks()


@pytest.mark.slow
@pytest.mark.skipif(not BLOCKS, reason=f"no seeds in {SEEDS}")
@pytest.mark.parametrize("code", BLOCKS or [None])
def test_seed_block_ports_to_code_that_compiles(code: str) -> None:
    try:
        compile(code, "<seed>", "exec")
    except SyntaxError as exc:
        pytest.skip(f"the block does not compile before porting either ({exc.msg}, line {exc.lineno}): "
                    "prose, notebook output or a diff")
    for style in ("npu_migrate", "torch"):
        result = port_source(code, style=style)
        compile(result.code, f"<seed ported, {style}>", "exec")
        assert port_source(result.code, style=style).code == result.code


@pytest.mark.slow
def test_seeds_give_real_work() -> None:
    """The extractor finds the seeds' training code, and porting it removes every CUDA call."""
    compiled = []
    for param in BLOCKS:
        code = param.values[0]
        try:
            compile(code, "<seed>", "exec")
        except SyntaxError:
            continue
        compiled.append(port_source(code).code)
    if not BLOCKS:
        pytest.skip(f"no seeds in {SEEDS}")
    joined = "\n".join(compiled)
    assert "nm.get_device(" in joined and "nm.default_backend()" in joined
    assert "torch.cuda." not in joined and ".cuda(" not in joined
