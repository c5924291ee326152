"""The examples as users run them: 2 ranks on CPU through the launcher, torchrun and one plain process.

Runs are short (``--dry-run``, ``--limit-batches``, small epochs) except one: MNIST on the
offline digits for up to 10 epochs, which must reach 95% held-out accuracy. What a run did is
read from its ``--metrics`` file, never from timing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAKE_NPU, child_env, free_port
from support import EXAMPLES, check_rows, load_example, ok, rows, write_idx

DIGITS_HELD_OUT = 359
OFFLINE_ENV = {  # any download fails at once: the proxy is a closed local port
    "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
    "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "no_proxy": "", "NO_PROXY": "",
}


def launch(tmp: Path, example: str, *args: str, nproc: int = 2, paths: tuple = (), timeout: float = 120,
           runner: str = "npu_migrate", **env: str) -> subprocess.CompletedProcess:
    """Run ``examples/EXAMPLE`` with 2 ranks (or as one plain process with ``runner="plain"``)."""
    script = str(EXAMPLES / example)
    if runner == "npu_migrate":
        cmd = [sys.executable, "-m", "npu_migrate.launch", "--device-num", str(nproc), script]
    elif runner == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), script]
    else:
        cmd = [sys.executable, script]
    return subprocess.run([*cmd, "--data-dir", str(tmp / "data"), *args], env=child_env(*paths, **env),
                          cwd=tmp, capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- 2 ranks on CPU


@pytest.mark.long
def test_mnist_on_offline_digits_reaches_95_percent(tmp_path: Path) -> None:
    metrics = tmp_path / "digits.jsonl"
    result = ok(launch(tmp_path, "mnist.py", "--dataset", "digits", "--epochs", "10", "--metrics", str(metrics)))
    got = rows(metrics)
    check_rows(got, list(range(1, 11)))
    # every held-out sample counted once, although 359 does not divide by 2 ranks
    assert {r["test_samples"] for r in got} == {DIGITS_HELD_OUT}
    assert {r["samples"] for r in got} == {1438}
    assert got[-1]["test_accuracy"] >= 0.95, got[-1]
    # One prefix a line: the launcher's relay names the rank, the example's logging adds none.
    assert "rank0] INFO __main__: test accuracy" in result.stderr, result.stderr
    assert "[rank 0/2]" not in result.stderr
    assert "rank1] INFO" not in result.stderr  # logs come from rank 0 only


RESUME_ARGS = ["--dataset", "digits", "--limit-batches", "8"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The metrics of an uninterrupted 4-epoch DDP run, shared by the resume and all_reduce tests."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    ok(launch(tmp, "mnist.py", *RESUME_ARGS, "--epochs", "4", "--metrics", str(tmp / "full.jsonl")))
    return rows(tmp / "full.jsonl")


@pytest.mark.long
def test_resume_after_epoch_2_of_4_repeats_the_uninterrupted_run(tmp_path: Path, uninterrupted: list[dict]) -> None:
    stopped = [*RESUME_ARGS, "--checkpoint-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "resumed.jsonl")]
    ok(launch(tmp_path, "mnist.py", *stopped, "--epochs", "2"))
    assert (tmp_path / "ckpt" / "last.pt").exists()
    assert not list((tmp_path / "ckpt").glob(".*tmp"))  # written atomically, nothing left behind
    result = ok(launch(tmp_path, "mnist.py", *stopped, "--epochs", "4", "--resume"))
    assert "resumed from" in result.stderr and "after epoch 2" in result.stderr
    resumed = rows(tmp_path / "resumed.jsonl")
    check_rows(resumed, [1, 2, 3, 4])  # rows 1-2 from the first run, 3-4 appended by the resumed one
    for a, b in zip(uninterrupted, resumed):
        assert abs(a["test_loss"] - b["test_loss"]) <= 1e-4, (a, b)
        assert abs(a["train_loss"] - b["train_loss"]) <= 1e-4, (a, b)
    assert resumed[-1]["test_loss"] == uninterrupted[-1]["test_loss"]  # bit for bit on CPU


@pytest.mark.long
def test_manual_allreduce_matches_ddp(tmp_path: Path, uninterrupted: list[dict]) -> None:
    metrics = tmp_path / "allreduce.jsonl"
    ok(launch(tmp_path, "mnist.py", *RESUME_ARGS, "--epochs", "4", "--grad-sync", "allreduce", "--metrics", str(metrics)))
    manual = rows(metrics)
    assert [r["grad_sync"] for r in uninterrupted + manual] == ["ddp"] * 4 + ["allreduce"] * 4
    for a, b in zip(uninterrupted, manual):  # the same averaged gradients, so the same model
        assert abs(a["test_loss"] - b["test_loss"]) <= 1e-5, (a, b)


@pytest.mark.slow
def test_cifar10_synthetic_dry_run(tmp_path: Path) -> None:
    metrics = tmp_path / "cifar.jsonl"
    ok(launch(tmp_path, "cifar10.py", "--synthetic", "--dry-run", "--batch-size", "4", "--metrics", str(metrics),
              "--checkpoint-dir", str(tmp_path / "ckpt")))
    got = rows(metrics)
    check_rows(got, [1])
    assert got[0]["samples"] == 2 * 2 * 4 and got[0]["test_samples"] == 2 * 2 * 4  # 2 batches of 4 on 2 ranks
    assert (tmp_path / "ckpt" / "last.pt").exists()


@pytest.mark.slow
def test_regression_trainer_learns(tmp_path: Path) -> None:
    metrics = tmp_path / "regression.jsonl"
    ok(launch(tmp_path, "regression.py", "--epochs", "3", "--metrics", str(metrics)))
    got = rows(metrics)
    check_rows(got, [1, 2, 3], classify=False)
    assert got[-1]["test_samples"] == 500 and got[-1]["samples"] == 2048
    assert got[-1]["test_loss"] < 0.05  # the noise floor is 0.01; the untrained model is far above 1


@pytest.mark.slow
def test_regression_under_torchrun(tmp_path: Path) -> None:
    metrics = tmp_path / "torchrun.jsonl"
    ok(launch(tmp_path, "regression.py", "--dry-run", "--metrics", str(metrics), runner="torchrun"))
    check_rows(rows(metrics), [1], classify=False)


# --------------------------------------------------------------------------- one plain process


@pytest.mark.slow
def test_mnist_as_one_plain_process_reads_torchvision_layout(tmp_path: Path) -> None:
    """One plain `python examples/mnist.py`, offline, on the digits written as MNIST's idx files."""
    import numpy as np

    mnist = load_example("mnist")
    train, test = mnist.load_digits()
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, data in (("train", train), ("t10k", test)):
        images, labels = data.tensors
        pixels = ((images * mnist.STD + mnist.MEAN) * 255).round().clamp(0, 255).squeeze(1).numpy().astype(np.uint8)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", pixels)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels.numpy().astype(np.uint8))
    metrics = tmp_path / "layout.jsonl"
    result = ok(launch(tmp_path, "mnist.py", "--dry-run", "--metrics", str(metrics), runner="plain", **OFFLINE_ENV))
    assert "MNIST: 1438 training and 359 held-out samples" in result.stderr
    got = rows(metrics)
    check_rows(got, [1], world_size=1)
    assert got[0]["samples"] == 2 * 32  # --dry-run: 2 batches


@pytest.mark.slow
def test_offline_without_data_fails_in_one_line(tmp_path: Path) -> None:
    result = launch(tmp_path, "mnist.py", runner="plain", **OFFLINE_ENV)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("error: MNIST is not in") and "could not be downloaded" in lines[0]
    assert "--synthetic" in lines[0] and "--dataset digits" in lines[0], lines[0]
    assert "--synthetic" in load_example("cifar10").OFFLINE  # CIFAR-10 fails through the same code


@pytest.mark.parametrize("argv, message", [
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--batch-size", "0"], "--batch-size 0 must be at least 1"),
    (["--dataset", "fashion"], "invalid choice: 'fashion'"),
])
def test_bad_flags_are_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    mnist = load_example("mnist")
    parser = mnist.build_parser()
    with pytest.raises(SystemExit) as exc:
        mnist.common.finish_args(parser, parser.parse_args(argv))
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_help_shows_defaults() -> None:
    for name in ("mnist", "cifar10", "regression"):
        text = load_example(name).build_parser().format_help()
        assert "(default: ./data)" in text and "--dry-run" in text and "--metrics FILE" in text


def test_examples_name_no_device_family() -> None:
    for path in EXAMPLES.glob("*.py"):
        source = path.read_text()
        for word in ("cuda", "nccl", "MASTER_PORT", "hccl"):
            assert word not in source, f"{path.name} names {word!r}; get the device from npu_migrate"


# --------------------------------------------------------------------------- the simulated-NPU tier

FAKE_NPU_RUNS = [
    ("mnist.py", ["--dataset", "digits", "--dry-run"]),
    ("cifar10.py", ["--synthetic", "--dry-run", "--batch-size", "4"]),
    ("regression.py", ["--dry-run"]),
]


@pytest.mark.slow
@pytest.mark.fake_npu
@pytest.mark.parametrize("example, args", FAKE_NPU_RUNS, ids=[e for e, _ in FAKE_NPU_RUNS])
def test_example_runs_on_simulated_npu(tmp_path: Path, example: str, args: list[str]) -> None:
    metrics = tmp_path / "npu.jsonl"
    result = ok(launch(tmp_path, example, *args, "--metrics", str(metrics), "--checkpoint-dir", str(tmp_path / "ckpt"),
                       paths=(FAKE_NPU,), FAKE_NPU_DEVICE_COUNT="2"))
    assert "on npu with hccl" in result.stderr
    check_rows(rows(metrics), [1], classify=example != "regression.py", device="npu", backend="hccl")
    assert (tmp_path / "ckpt" / "last.pt").exists()
