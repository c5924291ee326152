"""The port rule table: one row per rule code.

Usage::

    from npu_migrate.port.rules import RULES, select_rules

    for rule in RULES:
        print(rule.code, rule.summary, "->", rule.fix)

A :class:`~npu_migrate.port.context.Rule` is a code (``NM001``), the libcst node types it looks
at, a matcher (in :mod:`npu_migrate.port.matchers`, by area), a one-line summary, a suggested fix
and the text triggers of the prefilter. What each ``torch.cuda`` API becomes is
:mod:`npu_migrate.cuda_api`'s table; how each result is spelled per style is
:mod:`npu_migrate.port.targets`. ``NM0xx`` rules rewrite (``NM02x`` port Ascend-only input);
``NM1xx`` rules only report. The fix of a CUDA-only library's rule is its advice in
:mod:`npu_migrate.libs.table`, the text ``npu-migrate ops`` gives too.
"""

from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst

from npu_migrate.errors import UnknownRuleError
from npu_migrate.libs.table import LIBRARIES
from npu_migrate.port.context import Rule
from npu_migrate.port.matchers import api, checkpoint, devices, distributed, libs, npu, ordinals, reports
from npu_migrate.port.targets import STYLES, TARGETS  # noqa: F401 - re-exported for the CLI and tests

_CALL = (cst.Call,)
_REF = (cst.Attribute, cst.Name, cst.Import, cst.ImportFrom)
_CUDA = (r"cuda",)

RULES: tuple[Rule, ...] = (
    Rule("NM001", "cuda-method", "`.cuda()`, `.cuda(i)`, `.cuda(non_blocking=...)` on tensors and modules",
         "`.to(torch.device(nm.device_type()))` (the current device) or `.to(nm.get_device(i))`", _CALL,
         devices.match_cuda_method, (r"\.cuda\(",)),
    Rule("NM002", "torch-device", '`torch.device("cuda")`, `torch.device("cuda", i)`, `torch.device(f"cuda:{i}")`, '
         '`torch.device("cuda" if torch.cuda.is_available() else "cpu")`',
         "`torch.device(nm.device_type())` (the current device) or `nm.get_device(i)`", _CALL,
         devices.match_torch_device, _CUDA),
    Rule("NM003", "device-string", '"cuda", "cuda:N" and f"cuda:{i}" used as devices: `.to(...)`, `device=`, '
         '`device_type=`, `torch.autocast("cuda")`, `device = "cuda"`, argparse `--device` defaults',
         "a `torch.device` where torch takes the device; `nm.device_type()` / `str(nm.get_device(i))` "
         "where the value stays a string (variables, argparse, the user's own functions)",
         _CALL + (cst.Assign, cst.AnnAssign), devices.match_device_string, _CUDA),
    Rule("NM004", "torch-cuda-api", "`torch.cuda.*` calls that npu_migrate.cuda_api maps: is_available, "
         "device_count, set_device, current_device, synchronize, manual_seed(_all), memory statistics, "
         "mem_get_info, empty_cache, Event, Stream, stream, current_stream, get_device_name, "
         "get_device_capability, get_device_properties, is_bf16_supported; availability guards",
         "the device-neutral call of the same meaning, keyword names mapped", _CALL, api.match_cuda_api, _CUDA),
    Rule("NM005", "cuda-amp", "`torch.cuda.amp.autocast(...)` and `torch.cuda.amp.GradScaler(...)`",
         "`torch.amp.autocast(device_type=nm.device_type(), ...)` and `nm.grad_scaler(...)`",
         _CALL, api.match_amp, _CUDA),
    Rule("NM006", "nccl-backend", '"nccl" as the backend of `init_process_group`, `backend=`, argparse '
         "defaults and `backend = ...` variables", "`nm.default_backend()`",
         _CALL + (cst.Assign, cst.AnnAssign), distributed.match_nccl, (r"nccl",)),
    Rule("NM007", "ddp-device-ids", "DDP `device_ids=[i]` and `output_device=i` (CPU needs None)",
         "`device_ids=nm.device_ids(i), output_device=nm.output_device(i)`", _CALL, distributed.match_ddp,
         (r"device_ids", r"output_device", r"DistributedDataParallel|DDP\(")),
    Rule("NM008", "map-location", "`torch.load(..., map_location=...)` with a CUDA string, a dict of CUDA strings "
         "or `lambda storage, loc: storage.cuda(i)`",
         "`map_location=nm.get_device(i)`; dict values `str(nm.get_device(i))`", _CALL,
         checkpoint.match_map_location, _CUDA),
    Rule("NM009", "is-cuda", "`tensor.is_cuda`", "`tensor.device.type == nm.device_type()`",
         (cst.Attribute,), devices.match_is_device, (r"is_cuda",)),
    Rule("NM010", "visible-devices", '`os.environ["CUDA_VISIBLE_DEVICES"]`, `os.environ.get(...)`, `os.getenv(...)`, '
         '`"CUDA_VISIBLE_DEVICES" in os.environ`', "`os.environ[nm.visible_devices_env()]`",
         _CALL + (cst.Subscript, cst.Comparison), distributed.match_visible_devices, (r"CUDA_VISIBLE_DEVICES",)),
    Rule("NM011", "index-device", "integer device ordinals (`0`, `rank`, `local_rank`, `args.gpu`, `int(...)`), "
         "which torch takes as CUDA devices: `.to(i)`, `.to(device=i)`, `torch.device(i)`, `device=i` of every torch "
         "call that takes a device (factories, `torch.Generator`, nn modules, `x.new_zeros`, `model.to_empty`), "
         "`torch.load(map_location=i)` and dict values", "`nm.get_device(i)` (`str(nm.get_device(i))` as a "
         "map_location dict value)", _CALL, ordinals.match_ordinal, ordinals.TRIGGERS),
    Rule("NM020", "torch-npu-import", "`import torch_npu`, `from torch_npu.contrib import transfer_to_npu`",
         "dropped where nothing else uses them (npu_migrate loads torch_npu when the NPU is selected)",
         (cst.Import, cst.ImportFrom), npu.match_npu_import, (r"torch_npu",)),
    Rule("NM021", "torch-npu-api", "`torch.npu.*` and `torch_npu.npu.*` calls, `torch.npu.amp`",
         "the device-neutral call, as NM004/NM005", _CALL, npu.match_npu_api, (r"torch\.npu|torch_npu|import npu",)),
    Rule("NM022", "npu-device", '`.npu()`, `torch.device("npu")`, "npu:N" strings as devices, `tensor.is_npu`',
         "as NM001/NM002/NM003/NM009 for CUDA", _CALL + (cst.Assign, cst.AnnAssign, cst.Attribute),
         npu.match_npu_device, (r"\.npu\(|is_npu|[\"']npu",)),
    Rule("NM023", "hccl-backend", '"hccl" as the backend', "`nm.default_backend()`",
         _CALL + (cst.Assign, cst.AnnAssign), npu.match_hccl, (r"[\"']hccl",)),
    Rule("NM030", "flash-attn", "`from flash_attn import flash_attn_func, flash_attn_varlen_func, ...`, "
         "`import flash_attn`, `flash_attn.flash_attn_interface`",
         "the same names from `npu_migrate.libs.flash_attn` (SDPA off the NPU, npu_fusion_attention on it; "
         "causal alignment, windows, GQA, varlen kept)", (cst.Import, cst.ImportFrom), libs.match_flash_attn,
         (r"flash_attn",)),
    Rule("NM031", "xformers", "`xformers.ops.memory_efficient_attention` and its attention biases "
         "(`LowerTriangularMask`, `LowerTriangularFromBottomRightMask`, `BlockDiagonalMask`, tensor bias)",
         "the same names from `npu_migrate.libs.xformers`", (cst.Import, cst.ImportFrom), libs.match_xformers,
         (r"xformers",)),
    Rule("NM032", "apex-fused", "apex `FusedAdam`, `FusedSGD`, `FusedLayerNorm`, `FusedRMSNorm` and `apex.amp`",
         "the same names from `npu_migrate.libs.apex` / `npu_migrate.libs.apex_amp` (apex's defaults kept)",
         (cst.Import, cst.ImportFrom), libs.match_apex, (r"apex",)),
    Rule("NM101", "cuda-extension", "CUDA extensions: `torch.utils.cpp_extension`, `.cu`/`.cuh` sources",
         "port the kernels to Ascend C / torch_npu op-plugin, or keep a pure-PyTorch fallback",
         _REF + (cst.SimpleString,), reports.match_cu_source, (r"cpp_extension", r"\.cuh?['\"]")),
    Rule("NM102", "apex", "NVIDIA apex parts NM032 does not port (apex.parallel, SyncBatchNorm, contrib...)",
         LIBRARIES["apex"].advice,
         _REF, reports.reference_matcher(("apex",), "{name} is NVIDIA apex, built for CUDA"), (r"apex",)),
    Rule("NM103", "cupy", "CuPy arrays and kernels", LIBRARIES["cupy"].advice,
         _REF, reports.reference_matcher(("cupy",), "{name} is CuPy, which runs on CUDA only"), (r"cupy",)),
    Rule("NM104", "triton", "Triton kernels", LIBRARIES["triton"].advice,
         _REF, reports.reference_matcher(("triton",), "{name}: Triton kernels are compiled for GPUs"), (r"triton",)),
    Rule("NM105", "nvtx", "`torch.cuda.nvtx` ranges", "use torch.profiler.record_function",
         _REF, reports.reference_matcher(("torch.cuda.nvtx",), "{name} marks ranges for NVIDIA profilers only"),
         (r"nvtx",)),
    Rule("NM106", "cuda-graphs", "CUDA graphs: `torch.cuda.CUDAGraph`, `torch.cuda.graph`, "
         "`make_graphed_callables`", "guard with nm.device_type() == \"cuda\" or use torch.compile",
         _REF, reports.reference_matcher(("torch.cuda.CUDAGraph", "torch.cuda.graph", "torch.cuda.graphs",
                                          "torch.cuda.make_graphed_callables"), "{name} captures CUDA graphs"),
         _CUDA),
    Rule("NM107", "float64", "float64 tensors (`torch.float64`, `torch.double`, `.double()`)",
         "use float32 on the device (keep float64 on the CPU only)",
         (cst.Call, cst.Attribute, cst.Name), reports.match_float64, (r"float64", r"double")),
    Rule("NM108", "data-parallel", "`torch.nn.DataParallel`", "use DistributedDataParallel with one process per "
         "device (npu-migrate launch)", _REF,
         reports.reference_matcher(("torch.nn.DataParallel", "torch.nn.parallel.DataParallel"),
                                   "{name} is single-process multi-device, which Ascend does not support"),
         (r"DataParallel",)),
    Rule("NM109", "device-comparison", '`x.device.type == "cuda"` and other comparisons with "cuda"/"nccl"',
         "compare with nm.device_type() (or nm.default_backend())", (cst.Comparison,),
         reports.match_device_comparison, (r"cuda", r"nccl")),
    Rule("NM110", "cuda-version", "`torch.version.cuda`", "check nm.device_type() instead of the CUDA version",
         _REF, reports.reference_matcher(("torch.version.cuda",), "{name} is None on NPU and CPU builds"), _CUDA),
    Rule("NM111", "nccl-env", "NCCL_* environment variables", "set the HCCL_* equivalent on Ascend",
         (cst.SimpleString,), distributed.match_nccl_env, (r"NCCL_",)),
    Rule("NM112", "unmapped-cuda-api", "`torch.cuda.*` (and `torch.npu.*`) APIs that npu_migrate.cuda_api does "
         "not map", "the table's advice: find the torch.accelerator equivalent, or guard the call with "
         "nm.device_type() == \"cuda\"", (cst.Attribute, cst.Name), api.match_unmapped, (r"cuda", r"torch\.npu|torch_npu")),
    Rule("NM113", "cuda-literal", '"cuda", "cuda:N" or "nccl" strings the rewrite rules did not place',
         "use nm.device_type(), nm.get_device(i) or nm.default_backend() if it names the device or backend",
         (cst.SimpleString,), reports.match_leftover_literal, (r"cuda", r"nccl")),
)

RULE_CODES: tuple[str, ...] = tuple(r.code for r in RULES)

# Report-only rules judged on the ported tree: a literal is left over only if no rewrite took it.
DEFERRED: frozenset[str] = frozenset({"NM113"})


def rule_by_code(code: str) -> Rule:
    """Return the rule with ``code`` (case and surrounding spaces ignored, as ``--select`` reads it).

    Raises:
        UnknownRuleError: no rule has that code; the one-line message lists the known codes
            (a ``KeyError`` and a ``ValueError``).
    """
    key = code.strip().upper()
    for rule in RULES:
        if rule.code == key:
            return rule
    raise UnknownRuleError(
        f"Unknown rule code {code!r}. Expected one of: {', '.join(RULE_CODES)}. "
        "Run `npu-migrate port --list-rules` to see them."
    )


def select_rules(select: Optional[Sequence[str]] = None, ignore: Optional[Sequence[str]] = None) -> tuple[Rule, ...]:
    """The rules chosen by ``select`` and not dropped by ``ignore``; codes may be prefixes (``NM1``).

    Raises:
        ValueError: a code or prefix matches no rule; the message lists the known codes.
    """
    def expand(codes: Sequence[str], option: str) -> set[str]:
        out: set[str] = set()
        for raw in codes:
            code = raw.strip().upper()
            if not code:
                continue
            found = {c for c in RULE_CODES if c.startswith(code)}
            if not found:
                raise ValueError(
                    f"Unknown rule code {raw!r} in {option}. Expected codes or prefixes of: "
                    f"{', '.join(RULE_CODES)}. Run `npu-migrate port --list-rules` to see them."
                )
            out |= found
        return out

    chosen = expand(select, "--select") if select else set(RULE_CODES)
    chosen -= expand(ignore or (), "--ignore")
    return tuple(r for r in RULES if r.code in chosen)
