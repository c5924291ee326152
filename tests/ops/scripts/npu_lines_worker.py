"""A rank that prints torch_npu's own warning lines (as a real NPU job would), and records its environment."""
import os
import sys

rank = int(os.environ["RANK"])
out = os.environ["OUT_DIR"]
with open(os.path.join(out, f"rank{rank}.env"), "w") as fh:
    fh.write(os.environ.get("TORCH_NPU_FALLBACK_CPU_DISABLE", "<unset>"))
if rank == 0:
    for _ in range(2):
        print("[W610 18:26:03.055846726 VariableFallbackKernel.cpp:250] Warning: CAUTION: The operator "
              "'aten::isin.Tensor_Tensor_out' is not currently supported on the NPU backend and will fall back to run "
              "on the CPU. This may have performance implications. (function npu_cpu_fallback)", file=sys.stderr)
    print("Warning: kernel [ArgSort] can not support dtype int32 or int64 on AiCore, Now this kernel is running on "
          "AiCpu.If you are more concerned about high-performance execution,please cast dtype to float32.")
    print("an ordinary line that mentions the CPU and double precision")
else:
    print("[Cumsum] Dtype Double will be replaced with Float!")
    print("RuntimeError: The operator 'aten::special_entr.out' would execute its main computation on CPU through "
          "dispatcher backend fallback, but CPU fallback is disabled by TORCH_NPU_FALLBACK_CPU_DISABLE=1.",
          file=sys.stderr)
