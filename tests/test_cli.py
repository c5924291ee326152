"""The npu-migrate command as a user runs it: exit codes, one-line errors, the env report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import BROKEN_NPU, HOST_FAMILY, MISMATCHED_NPU, ROOT, TORCH_AUTOLOADS, child_env, run_cli

REQUIRED_KEYS = {"device_type", "backend", "device_count", "torch_version", "torch_npu_version"}


def assert_one_line_error(result: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


@pytest.mark.slow
def test_env_json_on_the_cpu_tier_is_cpu_gloo() -> None:
    result = run_cli("env", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert REQUIRED_KEYS <= report.keys()
    assert (report["device_type"], report["backend"], report["device_count"]) == ("cpu", "gloo", 1)
    assert report["torch_version"] == torch.__version__
    assert report["torch_npu_version"] is None


@pytest.mark.slow
def test_env_text_names_family_and_source() -> None:
    result = run_cli("env", env=child_env(NPU_MIGRATE_DEVICE="cpu", HCCL_CONNECT_TIMEOUT="600"))
    assert result.returncode == 0, result.stderr
    assert "device_type          cpu (NPU_MIGRATE_DEVICE)" in result.stdout
    assert "HCCL_CONNECT_TIMEOUT=600" in result.stdout


@pytest.mark.slow
def test_forcing_npu_without_torch_npu_fails_in_one_line() -> None:
    result = run_cli("env", env=child_env(NPU_MIGRATE_DEVICE="npu"))
    line = assert_one_line_error(result, 1, "npu needs torch_npu, which is not installed")
    # The release is named from a cached wheel's METADATA (the exact pip commands, the torch build
    # included); without one, the line says which command finds it on the index.
    assert "pip install torch-npu==" in line or "`npu-migrate env --releases` names it" in line, line


@pytest.mark.slow
def test_broken_torch_npu_fails_in_one_line() -> None:
    result = run_cli("env", "--device", "npu", env=child_env(BROKEN_NPU))
    if TORCH_AUTOLOADS:  # `import torch` itself fails: torch imports torch_npu through its entry point
        assert_one_line_error(result, 1, "`import torch` failed: it auto-loads torch_npu, which failed: libascendcl.so",
                              "set_env.sh", "TORCH_DEVICE_BACKEND_AUTOLOAD=0")
    else:
        assert_one_line_error(result, 1, "failed to import: libascendcl.so", "set_env.sh")


@pytest.mark.slow
@pytest.mark.skipif(not TORCH_AUTOLOADS, reason="torch < 2.5 does not auto-load device extensions")
@pytest.mark.parametrize("command", [["env"], ["launch", "--device-num", "1"], ["run"]])
def test_broken_autoloaded_torch_npu_fails_every_torch_command_in_one_line(tmp_path: Path, command: list[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    if command[0] != "env":
        command = [*command, str(script)]
    result = run_cli(*command, env=child_env(BROKEN_NPU, NPU_MIGRATE_DEVICE=""))
    assert_one_line_error(result, 1, "auto-loads torch_npu", "source /usr/local/Ascend/ascend-toolkit/set_env.sh",
                          "set TORCH_DEVICE_BACKEND_AUTOLOAD=0")


@pytest.mark.slow
def test_broken_torch_npu_with_cpu_forced_still_works() -> None:
    result = run_cli("env", "--json", "--device", "cpu", env=child_env(BROKEN_NPU, NPU_MIGRATE_DEVICE=""))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["device_type"], report["device_source"]) == ("cpu", "argument")
    if TORCH_AUTOLOADS:  # turned off for this process and what it starts, as the message says
        assert report["environment"]["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"


@pytest.mark.skipif(TORCH_AUTOLOADS, reason="torch >= 2.5 auto-loads torch_npu, so a broken one fails `import torch`")
def test_broken_torch_npu_is_a_warning_when_detecting() -> None:
    report = json.loads(run_cli("env", "--json", env=child_env(BROKEN_NPU, NPU_MIGRATE_DEVICE="")).stdout)
    assert report["device_type"] == HOST_FAMILY
    assert any("libascendcl.so" in w for w in report["warnings"])


def test_mismatched_torch_npu_fails_in_one_line() -> None:
    result = run_cli("env", "--device", "npu", env=child_env(MISMATCHED_NPU))
    # Refused from metadata alone: importing it (or torch, which would auto-load it) never happens.
    assert_one_line_error(result, 1, "torch_npu 1.11.0.post1", f"torch {torch.__version__.split('+')[0]}")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["flag", "variable"])
def test_unknown_family_is_a_usage_error_listing_families(how: str) -> None:
    if how == "flag":
        result = run_cli("env", "--device", "gpu")
    else:
        result = run_cli("env", env=child_env(NPU_MIGRATE_DEVICE="gpu"))
    if how == "flag":  # argparse's choices
        assert_one_line_error(result, 2, "invalid choice: 'gpu'", "'auto', 'npu', 'cuda', 'cpu'")
    else:
        assert_one_line_error(result, 2, "Unknown device 'gpu'", "Expected one of: auto, npu, cuda, cpu")


@pytest.mark.slow
def test_console_script_matches_python_dash_m() -> None:
    script = Path(sys.executable).with_name("npu-migrate")
    if not script.exists():
        pytest.skip("npu-migrate is not installed next to this interpreter (not a pip install)")
    result = subprocess.run([str(script), "env", "--json"], capture_output=True, text=True, env=child_env(), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["device_type"] == "cpu"


def test_version_and_missing_subcommand() -> None:
    assert run_cli("--version").stdout.startswith("npu-migrate 0.1.0")
    assert run_cli().returncode == 2


# --------------------------------------------------------------------------- exit codes, per sub-command

TRAIN_OK = "import sys\nprint('trained')\n"
TRAIN_FAILS = "raise SystemExit(1)\n"


@pytest.mark.parametrize(("argv", "code"), [
    # 0: it worked
    (["--version"], 0),
    (["--help"], 0),
    (["env", "--json"], 0),
    (["port", "--list-rules"], 0),
    (["check", "{clean}"], 0),
    (["launch", "--device", "cpu", "--device-num", "1", "{ok}"], 0),
    (["run", "--device", "cpu", "{ok}"], 0),
    (["smoke", "--device", "cpu", "--nproc", "1", "--steps", "2"], 0),
    # 1: it ran and failed (or found something)
    (["check", "{cuda}"], 1),
    (["launch", "--device", "cpu", "--device-num", "1", "{fails}"], 1),
    (["run", "--device", "cpu", "{fails}"], 1),
    (["env", "--device", "npu"], 1),  # no torch_npu here: the device is unavailable, not the input wrong
    # 2: the command line is wrong; nothing ran
    ([], 2),
    (["frobnicate"], 2),
    (["env", "--device", "gpu"], 2),
    (["launch", "--device-num", "0", "{ok}"], 2),
    (["launch", "--node-rank", "-1", "{ok}"], 2),
    (["launch", "--device-num", "1", "{missing}"], 2),
    (["run", "--device-num", "0", "{ok}"], 2),
    (["run", "{missing}"], 2),
    (["smoke", "--nproc", "0"], 2),
    (["port", "{missing}"], 2),
    (["check", "--select", "NM999", "{clean}"], 2),
], ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
@pytest.mark.slow
def test_exit_codes(tmp_path: Path, argv: list[str], code: int) -> None:
    files = {"ok": TRAIN_OK, "fails": TRAIN_FAILS, "clean": "x = 1\n", "cuda": "import torch\nx = torch.zeros(1).cuda()\n"}
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(text)
    argv = [a.format(**{n: str(tmp_path / f"{n}.py") for n in [*files, "missing"]}) for a in argv]
    result = run_cli(*argv)
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_run_leaves_the_scripts_logging_alone(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import logging\n"
        "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s %(message)s')\n"
        "logger = logging.getLogger(__name__)\n"
        "logger.info('epoch 1 loss 0.5')\n"
        "logging.getLogger('trainer.data').info('loaded 10 batches')\n"
    )
    result = run_cli("run", "--device", "cpu", str(script))
    assert result.returncode == 0, result.stderr
    assert "INFO __main__ epoch 1 loss 0.5" in result.stderr
    assert "INFO trainer.data loaded 10 batches" in result.stderr


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["port", "--list-rules"], ["check", "{src}"],
                                  ["port", "{src}"], ["launch", "--help"], ["env", "--help"], ["smoke", "--help"],
                                  ["compare", "--help"]])
def test_commands_that_need_no_torch_never_import_it(tmp_path: Path, argv: list[str]) -> None:
    (tmp_path / "train.py").write_text("import torch\nx = torch.zeros(1).cuda()\n")
    argv = [a.format(src=str(tmp_path / "train.py")) for a in argv]
    probe = (
        "import sys\n"
        "from npu_migrate.cli import main\n"
        "try:\n"
        "    code = main(sys.argv[1:])\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "sys.stdout.flush()\n"
        "print('TORCH-IMPORTED' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)\n"
        "raise SystemExit(code)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe, *argv], env=child_env(), capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert result.returncode in (0, 1), result.stderr
    assert result.stderr.strip().splitlines()[-1] == "NO-TORCH"


@pytest.mark.slow
def test_dry_run_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN_OK)
    for cmd in ([sys.executable, "-m", "npu_migrate", "launch"], [sys.executable, "-m", "npu_migrate.launch"]):
        # More output than a pipe holds (64 KiB): the script's arguments, echoed on the target line.
        many = [f"--option-{i:05d}=" + "x" * 32 for i in range(5000)]
        proc = subprocess.Popen([*cmd, "--dry-run", "--device", "cpu", "--device-num", "2", str(script), *many],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), cwd=ROOT)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()  # like `| head -1`: read a line, then go away
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(120) == 141, err
        assert "Traceback" not in err and "BrokenPipeError" not in err, err
