"""A script that stops at an installed library's CUDA check is told which ``--user-code`` fixes it.

Only the user's code gets the migrated answers; an installed library asking
``torch.cuda.is_available()`` gets torch's ``False`` (timm's ``init_distributed_device`` then
asserts "CUDA is not available but cuda was specified."). The decision (:func:`decide`) is tested
on frames; the record it reads, in-process with migration on; and one real case end to end: a
package in a throwaway ``site-packages`` folder (a library by migration's rule, as
``pip install --target`` makes) under ``npu-migrate run`` and ``launch --migrate``, where the
line names the package and the flag, and the same command with the flag succeeds.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, child_env, run_cli
from npu_migrate.launch.procs.failure import Failure
from npu_migrate.migrate.libraries.library_failure import CUDA_MISSING, Frame, decide, user_code_argument

USER, TORCH = Frame(), Frame(infra=True)
TOLD = Frame("timm", told_no_cuda=True)  # timm's init_distributed_device: torch told it is_available() False
TIMM = Frame("timm")
TIMM_MESSAGE = "CUDA is not available but cuda was specified."
LINE = ("the CUDA call is in {0} (installed), which gets torch's own answers: add --user-code {0} to migrate "
        "its calls too")

CHECK = '''import torch


def init_device(device="cuda"):
    if device.startswith("cuda"):
        assert torch.cuda.is_available(), "CUDA is not available but cuda was specified."
    return torch.device(device)


def pick_device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def build(rows):
    pick_device()  # falls back to the CPU, as it should; then fails for a reason of its own
    raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({rows}x2 and 3x4)")
'''

SCRIPT = '''import torch
import {package}

assert torch.cuda.is_available()  # the script's own code gets the migrated answer
device = {package}.init_device("cuda")
print("trained on", torch.ones(2, device=device).device)
'''


# --- the decision ----------------------------------------------------------------------------------

@pytest.mark.parametrize("frames, exc_type, message", [
    ([USER, TOLD], AssertionError, TIMM_MESSAGE),                       # timm: the message and the record
    ([USER, TOLD], AssertionError, ""),                                 # a bare assert right after the question
    ([USER, TOLD], RuntimeError, "training needs an accelerator"),      # raised in the function told no CUDA
    ([USER, TIMM, TORCH, TORCH], AssertionError, "Torch not compiled with CUDA enabled"),  # torch's, below timm
    ([USER, TIMM, TORCH], RuntimeError, "Found no NVIDIA driver on your system. Please check"),
    ([USER, TORCH, TIMM, TORCH], RuntimeError, "No CUDA GPUs are available"),
], ids=["timm", "bare-assert", "raised-after-asking", "not-compiled", "no-driver", "no-gpus"])
def test_an_installed_packages_cuda_check_names_the_package(frames: list[Frame], exc_type: type, message: str) -> None:
    assert decide(frames, exc_type, message, asked={"timm"}) == "timm"


@pytest.mark.parametrize("frames, exc_type, message, asked", [
    ([USER, TOLD], AssertionError, TIMM_MESSAGE, set()),                # it never asked through migration
    ([TIMM, USER, TORCH], AssertionError, TIMM_MESSAGE, {"timm"}),      # the user's own check (the innermost)
    ([USER, TOLD, TORCH], RuntimeError, "mat1 and mat2 shapes cannot be multiplied", {"timm"}),  # torch's, other
    ([USER, TOLD], ValueError, "lr must be positive", {"timm"}),        # an error of another kind
    ([USER, TIMM, Frame("timm")], RuntimeError, "bad config", {"timm"}),  # raised where nobody was told no CUDA
    ([USER, Frame("other"), TOLD], KeyError, "'model'", {"timm"}),      # a lookup that failed there
], ids=["never-asked", "user-code", "torch-error-below", "other-kind", "not-told-here", "keyerror"])
def test_other_failures_name_no_package(frames: list[Frame], exc_type: type, message: str, asked: set[str]) -> None:
    assert decide(frames, exc_type, message, asked=asked) is None


@pytest.mark.parametrize("message, missing", [
    ("Torch not compiled with CUDA enabled", True),
    ("Found no NVIDIA driver on your system.", True),
    ("CUDA error: no CUDA-capable device is detected", True),
    ("cuda is not available", True),
    ("GPU not found", True),
    ("runs/cuda_exp/model.pt: No such file or directory", False),
    ("expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!", False),
])
def test_what_counts_as_cuda_missing(message: str, missing: bool) -> None:
    assert bool(CUDA_MISSING.search(message)) is missing


def test_the_flag_names_a_package_only_where_the_name_finds_it(tmp_path: Path) -> None:
    assert user_code_argument("nm_not_installed_anywhere", str(tmp_path / "my pkg")) == f"'{tmp_path / 'my pkg'}'"
    pytest_dir = Path(pytest.__file__).parent
    assert user_code_argument("pytest", str(pytest_dir)) == "pytest"
    assert user_code_argument("pytest", str(tmp_path / "pytest")) == str(tmp_path / "pytest")  # another one


def test_the_ranks_own_hint_comes_first_and_travels_with_its_record() -> None:
    failure = Failure(rank=1, local_rank=1, node_rank=0, host="h", exc_type="AssertionError", message=TIMM_MESSAGE,
                      traceback="Traceback ...\nAssertionError: CUDA is not available", own_hint=LINE.format("timm"))
    assert failure.details()[0] == "hint: " + LINE.format("timm")
    assert Failure.from_record(failure.record()).hint() == LINE.format("timm")
    backend = Failure(rank=1, local_rank=1, node_rank=0, host="h", exc_type="RuntimeError",
                      message="Connection refused")
    assert "connection refused" in (backend.hint() or "")


# --- the record, in this process ---------------------------------------------------------------------

@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A package ``nm_cudacheck`` in a throwaway site-packages folder on sys.path, imported with migration on."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch has a CUDA device here: a library is told CUDA is available")
    site = tmp_path / "site-packages"
    (site / "nm_cudacheck").mkdir(parents=True)
    (site / "nm_cudacheck" / "__init__.py").write_text(CHECK)
    monkeypatch.syspath_prepend(str(site))
    from npu_migrate import migrate

    with migrate.enabled(device="cpu", device_count=2):
        yield importlib.import_module("nm_cudacheck")
    sys.modules.pop("nm_cudacheck", None)


def test_a_library_check_that_torch_told_no_cuda_gets_the_hint(installed) -> None:
    import torch

    from npu_migrate import failure_hints

    assert torch.cuda.is_available()  # this test's code is the user's: the migrated answer
    with pytest.raises(AssertionError) as raised:
        installed.init_device("cuda")
    assert failure_hints.hint(raised.value) == LINE.format("nm_cudacheck")
    try:  # a library error raised from it: the chain is followed
        try:
            installed.init_device("cuda")
        except AssertionError as exc:
            raise ValueError("could not set up the trainer") from exc
    except ValueError as chained:
        assert failure_hints.hint(chained) == LINE.format("nm_cudacheck")


def test_a_library_error_after_a_fallback_gets_no_hint(installed) -> None:
    from npu_migrate import failure_hints

    with pytest.raises(RuntimeError, match="mat1 and mat2") as raised:
        installed.build(3)
    assert failure_hints.hint(raised.value) is None
    with pytest.raises(AssertionError) as own:  # the user's own check
        assert installed.pick_device() == "cuda", "CUDA is not available"
    assert failure_hints.hint(own.value) is None


def test_no_hint_once_migration_is_off(installed) -> None:
    from npu_migrate import failure_hints, migrate

    with pytest.raises(AssertionError) as raised:
        installed.init_device("cuda")
    migrate.uninstall()
    assert failure_hints.HINTERS == () and failure_hints.hint(raised.value) is None


# --- end to end ----------------------------------------------------------------------------------------

def _project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """train.py in its own folder, calling ``cudacheck`` installed in another (a site-packages folder)."""
    site = tmp_path / "site-packages"
    (site / "cudacheck").mkdir(parents=True)
    (site / "cudacheck" / "__init__.py").write_text(CHECK)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(SCRIPT.format(package="cudacheck"))
    return project / "train.py", child_env(site)


@pytest.mark.slow
def test_npu_migrate_run_ends_with_the_package_and_the_flag_that_works(tmp_path: Path) -> None:
    script, env = _project(tmp_path)
    failed = run_cli("run", "--device", "cpu", str(script), env=env)
    assert failed.returncode == 1, failed.stderr
    assert failed.stderr.strip().splitlines()[-2:] == [
        f"AssertionError: {TIMM_MESSAGE}", "npu-migrate run: hint: " + LINE.format("cudacheck")]
    fixed = run_cli("run", "--device", "cpu", "--user-code", "cudacheck", str(script), env=env)
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.strip() == "trained on cpu" and "hint" not in fixed.stderr, fixed.stderr


@pytest.mark.slow
def test_launch_migrate_names_the_package_and_the_flag_that_works(tmp_path: Path) -> None:
    script, env = _project(tmp_path)
    command = [sys.executable, "-m", "npu_migrate.launch", "--migrate", "--device", "cpu", "--device-num", "2"]
    failed = subprocess.run([*command, str(script)], env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert failed.returncode == 1, failed.stderr
    lines = failed.stderr.splitlines()
    headline = next(i for i, line in enumerate(lines) if f"failed: AssertionError: {TIMM_MESSAGE}" in line)
    assert lines[headline + 1] == "  hint: " + LINE.format("cudacheck"), failed.stderr
    assert lines[-1].startswith("npu-migrate launch: job failed:"), failed.stderr
    fixed = subprocess.run([*command, "--user-code", "cudacheck", str(script)], env=env, capture_output=True,
                           text=True, timeout=180, cwd=ROOT)
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.count("trained on cpu") == 2 and "hint" not in fixed.stderr, fixed.stdout + fixed.stderr
