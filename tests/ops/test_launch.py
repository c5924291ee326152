"""``launch --strict-ops`` and torch_npu's fallback, AiCPU and float64-cast lines recognised in any rank's output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import Launch
from npu_migrate.npu_lines import Collected, Kind, recognise

WORKER = Path(__file__).with_name("scripts") / "npu_lines_worker.py"


@pytest.mark.parametrize("line, expected", [
    # As users' logs show it (torch_npu 2.x, VariableFallbackKernel.cpp).
    (b"[W610 18:26:03.055846726 VariableFallbackKernel.cpp:250] Warning: CAUTION: The operator "
     b"'aten::bitwise_left_shift.Tensor_out' is not currently supported on the NPU backend and will fall back to "
     b"run on the CPU. This may have performance implications. (function npu_cpu_fallback)",
     (Kind.CPU_FALLBACK, "aten::bitwise_left_shift.Tensor_out")),
    (b"CAUTION: The operator 'torchvision::roi_align' is not currently supported on the NPU backend and will fall "
     b"back to run on the CPU.", (Kind.CPU_FALLBACK, "torchvision::roi_align")),
    # Texts in torch-npu 2.14.0's libtorch_npu.so.
    (b"CAUTION: The operator aten::logit_backward and aten::logit_backward.out is currently not supported on the NPU "
     b"backend. Now this operator will fallback to run on the CPU and may have performance implications.",
     (Kind.CPU_FALLBACK, "aten::logit_backward")),
    (b"Warning: kernel [sinc] is not supported by NPU currently. Now this kernel is running on CPU.",
     (Kind.CPU_FALLBACK, "sinc")),
    (b"Warning: kernel [gcd.out] is not supported by NPU currently.Now this kernel is running on CPU.",
     (Kind.CPU_FALLBACK, "gcd.out")),
    (b"adaptive_max_pool3d is not supported by NPU currently. Now this kernel is running on CPU.",
     (Kind.CPU_FALLBACK, "adaptive_max_pool3d")),
    (b"Warning: kernel [ArgSort] can not support dtype int32 or int64 on AiCore, Now this kernel is running on "
     b"AiCpu.If you are more concerned about high-performance execution,please cast dtype to float32.",
     (Kind.AICPU, "ArgSort")),
    (b"[Cumsum] Dtype Double will be replaced with Float!", (Kind.DOUBLE_CAST, "Cumsum")),
    (b"Device do not support double dtype now, dtype cast replace with float.", (Kind.DOUBLE_CAST, "")),
    (b"Device do not support double dtype of rtol and atol now, dtype cast repalce with float.",
     (Kind.DOUBLE_CAST, "")),
    (b"The operator 'aten::isin.Tensor_Tensor_out' would execute its main computation on CPU through dispatcher "
     b"backend fallback, but CPU fallback is disabled by TORCH_NPU_FALLBACK_CPU_DISABLE=1.",
     (Kind.FALLBACK_REFUSED, "aten::isin.Tensor_Tensor_out")),
    (b"epoch 1: the CPU fell back to double precision", None),
])
def test_recognised_lines(line: bytes, expected: tuple | None) -> None:
    assert recognise(line) == expected


def test_counts_per_rank_and_summary() -> None:
    collected = Collected()
    line = b"CAUTION: The operator 'aten::isin' is not currently supported on the NPU backend and will fall back\n"
    collected.feed(1, line * 3 + b"loss 0.5\n")
    collected.feed(0, b"nothing here\n")
    assert collected.by_rank() == {"1": {"cpu_fallback": {"aten::isin": 3}}}
    assert collected.summary() == ["rank 1: torch_npu reported 3 CPU fallback(s) (aten::isin)"]


@pytest.mark.slow
def test_strict_ops_job_lists_each_ranks_lines(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    job = Launch(tmp_path, "--device-num", "2", "--strict-ops", "--error-file", str(error_file), str(WORKER))
    assert job.wait() == 0, job.err
    assert {r: (tmp_path / f"rank{r}.env").read_text() for r in (0, 1)} == {0: "1", 1: "1"}
    assert ("rank 0: torch_npu reported 2 CPU fallback(s) (aten::isin.Tensor_Tensor_out); "
            "1 AiCPU kernel(s) (ArgSort)") in job.err
    assert ("rank 1: torch_npu reported 1 fallback(s) refused by --strict-ops (aten::special_entr.out); "
            "1 float64 cast(s) (Cumsum)") in job.err
    report = json.loads(error_file.read_text())
    assert report["npu_warnings"] == {
        "0": {"cpu_fallback": {"aten::isin.Tensor_Tensor_out": 2}, "aicpu": {"ArgSort": 1}},
        "1": {"double_cast": {"Cumsum": 1}, "fallback_refused": {"aten::special_entr.out": 1}},
    }
    # The lines themselves still reach the console, untouched.
    assert "Dtype Double will be replaced with Float!" in job.outtext


@pytest.mark.slow
def test_without_strict_ops_the_fallback_stays_allowed(tmp_path: Path) -> None:
    job = Launch(tmp_path, "--device-num", "1", str(WORKER))
    assert job.wait() == 0, job.err
    assert (tmp_path / "rank0.env").read_text() == "<unset>"
    assert "rank 0: torch_npu reported 2 CPU fallback(s)" in job.err
