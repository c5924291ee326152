"""The advice: what was seen, turned into rules with sites and replacements; JSON, markdown, exit status.

Usage::

    from npu_migrate.advise import report

    data = report.build(seen, recorder, operators, env=os.environ)
    print(report.to_markdown(data))
    report.exit_status(data)      # 0: nothing to change; 1: advice (code or environment)

JSON::

    {"torch_npu": "2.14.0", "steps": 2,
     "advice": [{"rule": "rms_norm", "replace_with": "torch_npu.npu_rms_norm(x, weight, epsilon=eps)[0]",
                 "site": "model.py:17", "module": "RMSNorm", "per_step": 2.0, "why": "...",
                 "evidence": "pow at model.py:17, mean at model.py:17, rsqrt at model.py:18; npu::npu_rms_norm in ..."}],
     "env": [{"name": "TASK_QUEUE_ENABLE", "value": "2", "current": null, "why": "...", "trade_off": "..."}],
     "good": ["optimizer AdamW at train.py:40 is fused", ...]}

Rules (``rule``), and where each comes from:

* fusion patterns (:mod:`npu_migrate.advise.fusion`): ``rms_norm``, ``add_rms_norm``, ``add_layer_norm``,
  ``rotary``, ``swiglu``, ``geglu``, ``attention``: msprof-analyze's ``timeline_fusion_ops.yaml``,
  replacements read from the release (:mod:`npu_migrate.advise.replacements`);
* ``fused_optimizer``: a ``torch.optim`` optimizer without ``fused=True`` (torch-npu's fused optimizer
  guide): ``fused=True`` where the release registers the kernel (``_fused_adamw_``), else the release's
  ``torch_npu.optim.NpuFused*`` class of that name (``NpuFusedAdadelta``), else nothing;
* ``clip_grad_norm``: ``clip_grad_norm_(..., foreach=False)`` where the release registers the foreach norm;
* ``dataloader_workers``, ``dataloader_pin_memory``: a DataLoader with ``num_workers=0`` or without
  pinned memory (msprof-analyze's dataloader checker: slow data loading), unless its batches are on
  the device already (a dataset held on the device); a loader without workers that the run did not
  iterate is not judged;
* ``sync_batchnorm``: SyncBatchNorm layers in a DDP model (collectives in every forward and backward);
* ``ddp_no_sync``: DDP forwards that will all-reduce gradients more than once per optimizer step
  (gradient accumulation without ``no_sync()``);
* ``host_sync``: a host synchronisation in every step (``.item()``, ``.cpu()``, a boolean mask; the
  audit's counts; msprof-analyze's synchronize-stream checker);
* ``empty_cache``: ``torch.cuda.empty_cache()`` in every step (each call synchronises and frees
  the allocator's cache, which the next step allocates again);
* ``anomaly_detection``: autograd anomaly detection on while training (a check and a stack trace per
  operator; msTransplant flags it);
* ``float64``: float64 tensors on the device (the NPU's cube units have no float64; its vector units
  run it slowly, some operators not at all).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from npu_migrate.advise import environment
from npu_migrate.advise.fusion import RULES as FUSION_RULES
from npu_migrate.advise.replacements import Offer
from npu_migrate.textsafe import printable

def _short(site: str) -> str:
    from npu_migrate.ops.report import _short as short  # one way of shortening sites

    return short(site)


def _every_step(seen: Any, steps: int) -> bool:
    """Seen in (nearly) every step: in as many step intervals as the steps whose end the run saw.

    The run ends inside the last optimizer step, so a call after ``step()`` in the loop was seen
    ``steps - 1`` times; a call in the forward, ``steps`` times.
    """
    return steps >= 1 and len(seen.intervals) >= max(1, steps - 1)


def _per_step(seen: Any) -> float:
    return round(seen.count / max(1, len(seen.intervals)), 2)


def build(seen: Any, recorder: Any, operators: Any, env: Mapping[str, str]) -> dict[str, Any]:
    """The advice for one run (``seen``: :class:`npu_migrate.advise.watch.Watch`)."""
    offer = Offer(operators)
    steps = recorder.steps_done
    divide = max(1, steps)
    advice: list[dict[str, Any]] = []
    good: list[str] = []

    def add(rule: str, replace_with: str, site: str, module: str, per_step: float, why: str, evidence: str) -> None:
        advice.append({"rule": rule, "replace_with": replace_with, "site": _short(site), "module": module,
                       "per_step": per_step, "why": why, "evidence": evidence})

    # fusion patterns
    found = {rule for rule, _, _ in seen.matcher.found}
    for (rule, site, module), match in sorted(seen.matcher.found.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        offered = offer.fusion(rule)
        if offered is None:
            continue  # the release has no kernel for it: nothing to suggest
        call, why, evidence = offered
        add(rule, call, site, module, round(match.count / divide, 2), why, f"{', '.join(match.evidence)}; {evidence}")
    if seen.started:
        missing = [r for r in FUSION_RULES if r not in found]
        if missing:
            good.append(f"no hand-written {', '.join(missing)} in the forward")

    # optimizers
    for site, opt in seen.optimizers.items():
        kind = opt["kind"]
        if opt["fused"]:
            unregistered = offer.unregistered_fused(kind)
            if unregistered is None:
                good.append(f"optimizer {kind} at {_short(site)} is fused")
            else:
                add("fused_optimizer", unregistered[0], site, kind, 1.0,
                    f"{kind}(fused=True) calls a fused kernel this release does not register: on the NPU each "
                    "step runs it on the host, copying every parameter, gradient and state both ways (or "
                    "fails where torch has no CPU kernel for it)", unregistered[1])
            continue
        offered = offer.optimizer(kind)
        if offered is None:
            continue
        replace_with, evidence = offered
        add("fused_optimizer", replace_with, site, kind, 1.0,
            f"{kind} without fused=True runs a few kernels per parameter tensor"
            f"{' (foreach: per group of tensors)' if opt['foreach'] else ''}; the fused kernel updates every "
            "parameter in one launch", evidence)
    for site, clip in seen.clips.items():
        if clip["foreach"] is False and offer.foreach_norm():
            add("clip_grad_norm", "torch.nn.utils.clip_grad_norm_(..., foreach=True)", site, "", 1.0,
                "foreach=False computes one norm kernel per gradient", "aten::_foreach_norm.Scalar registered by "
                f"torch-npu {operators.release}")
        else:
            good.append(f"clip_grad_norm_ at {_short(site)} uses the foreach norm")

    # DDP
    for site, layers in seen.sync_batchnorm.items():
        add("sync_batchnorm", "nn.BatchNorm*d where the per-device batch is large enough for its statistics",
            site, "SyncBatchNorm", float(layers), "each SyncBatchNorm layer all-reduces its statistics in every "
            "forward and backward: collectives the step waits for", f"{layers} SyncBatchNorm layer(s)")
    for site, s in seen.ddp_forwards.items():
        per_step = _per_step(s)
        if per_step > 1 and _every_step(s, steps):
            add("ddp_no_sync", "with model.no_sync(): for every micro-batch but the last of a step", site,
                "DistributedDataParallel", per_step, "gradient accumulation without no_sync() all-reduces the "
                "gradients after every micro-batch's backward; only the last one's is needed",
                f"{s.count} DDP forwards that sync gradients in {len(s.intervals)} step(s)")
        elif _every_step(s, steps):
            good.append(f"DDP at {_short(site)}: one gradient all-reduce per step")

    # data loading
    for site, loader in seen.loaders.items():
        if loader["num_workers"] == 0 and not loader["batches"]:
            continue  # not iterated while the audit ran (an evaluation loader): nothing seen to judge
        if loader["device_batches"]:
            good.append(f"DataLoader at {_short(site)} yields batches already on the device")
            continue
        if loader["num_workers"] == 0:
            add("dataloader_workers", "DataLoader(..., num_workers=N, persistent_workers=True)", site, "DataLoader",
                1.0, "num_workers=0 loads and collates each batch in the training process, between steps: the "
                "NPU waits for the host", "num_workers=0")
        if not loader["pin_memory"]:
            add("dataloader_pin_memory", "DataLoader(..., pin_memory=True) and .to(device, non_blocking=True)",
                site, "DataLoader", 1.0, "pageable host memory is copied to the device synchronously; pinned "
                "memory lets the copy overlap the step", "pin_memory=False")
        if loader["num_workers"] and loader["pin_memory"]:
            good.append(f"DataLoader at {_short(site)}: {loader['num_workers']} workers, pinned memory")
    if any(loader["pin_memory"] and not loader["device_batches"] for loader in seen.loaders.values()):
        # Pinned batches copied without non_blocking=True: the copy still blocks the host.
        for site, s in seen.blocking_copies.items():
            if _every_step(s, steps):
                add("non_blocking", ".to(device, non_blocking=True)", site, "", _per_step(s),
                    "a copy from pinned memory overlaps the step only when asked with non_blocking=True; "
                    "without it the host waits for each copy", f"Tensor.to(device) {s.count}x without non_blocking")

    # the step
    syncs = [(key, s) for key, s in seen.syncs.items() if _every_step(s, steps)]
    for (what, site), s in syncs:
        add("host_sync", "keep the value on the device; read it every N steps (or accumulate, then .item() once)",
            site, "", _per_step(s), "the host waits until the device has finished everything queued, and the "
            "task queue drains: the NPU idles while the host catches up", f"{what} {s.count}x")
    if seen.started and not syncs and not seen.anomaly_syncs:
        good.append("no host sync in the step")
    empties = [(site, s) for site, s in seen.empty_cache.items() if _every_step(s, steps)]
    for site, s in empties:
        add("empty_cache", "remove it from the step (or call it every few hundred steps)", site, "", _per_step(s),
            "each call synchronises the device and returns the allocator's cache, which the next step allocates "
            "again", f"torch.cuda.empty_cache {s.count}x")
    if seen.anomaly is not None:
        checks = sum(_per_step(s) for s in seen.anomaly_syncs.values())
        add("anomaly_detection", "torch.autograd.set_detect_anomaly(False)", seen.anomaly or "?", "", 1.0,
            "anomaly detection checks every operator's output and keeps a stack trace per autograd node"
            + (f"; its NaN check of each gradient is a host sync: {checks:g} per step in the backward"
               if checks else ""),
            "torch.is_anomaly_enabled() in the forward"
            + "".join(f"; aten::_local_scalar_dense {s.count}x in the backward at {_short(site)}"
                      for site, s in seen.anomaly_syncs.items()))
    elif seen.started:
        good.append("anomaly detection off")
    doubles: dict[str, int] = {}
    for (op, overload, phase, site, via), entry in recorder.entries.items():
        # The backward's float64 follows from the forward's: advised where the forward made it.
        if not via and "float64" in entry.dtypes and phase != "backward":
            doubles[site] = doubles.get(site, 0) + entry.count
    for site, count in doubles.items():
        add("float64", "float32 (or bfloat16/float16 under autocast)", site, "", round(count / divide, 2),
            "float64 runs on the NPU's vector units only, many times slower than float32; some operators "
            "have no float64 kernel", f"{count} float64 calls")
    if seen.started and not doubles:
        good.append("no float64 on the device")

    changes, env_good = environment.check(env)
    good.extend(env_good)
    return {"torch_npu": operators.release, "steps": steps, "advice": advice, "env": changes, "good": good}


def exit_status(data: dict[str, Any]) -> int:
    """0 when nothing is to change (code or environment), 1 when there is advice."""
    return 1 if data["advice"] or data["env"] else 0


def _cell(text: Any) -> str:
    return printable(str(text)).replace("|", "\\|")


def to_markdown(data: dict[str, Any]) -> str:
    """The advice for people."""
    lines = [f"# npu-migrate advise: torch-npu {data['torch_npu']}", ""]
    advice = data["advice"]
    if advice:
        lines += [f"## To change ({len(advice)})", "", "| rule | site | module | per step | replace with | why |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for a in advice:
            lines.append(f"| {a['rule']} | `{_cell(a['site'])}` | {_cell(a['module'])} | {a['per_step']:g} | "
                         f"`{_cell(a['replace_with'])}` | {_cell(a['why'])} |")
        lines += ["", "Evidence:", ""]
        lines += [f"- {a['rule']} at `{_cell(a['site'])}`: {_cell(a['evidence'])}" for a in advice]
        lines.append("")
    if data["env"]:
        lines += ["## Environment", "", "| variable | set to | now | why | trade-off |", "| --- | --- | --- | --- | --- |"]
        for e in data["env"]:
            now = "unset" if e["current"] is None else f"`{_cell(e['current'])}`"
            lines.append(f"| `{e['name']}` | `{_cell(e['value'])}` | {now} | {_cell(e['why'])} | "
                         f"{_cell(e['trade_off'])} |")
        lines.append("")
    if data["good"]:
        lines += ["## Already good", ""] + [f"- {_cell(g)}" for g in data["good"]] + [""]
    if not advice and not data["env"]:
        lines += ["Nothing to change.", ""]
    return "\n".join(lines)


def write_json(data: dict[str, Any], path: str) -> None:
    from npu_migrate.fileio import write_atomic

    write_atomic(path, json.dumps(data, indent=1) + "\n")


def write_markdown(data: dict[str, Any], path: str) -> None:
    from npu_migrate.fileio import write_atomic

    write_atomic(path, to_markdown(data) + "\n")
