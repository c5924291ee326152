"""Cost of the operator audit: 2 steps of the MNIST example audited against the same 2 steps unaudited.

Usage::

    NPU_MIGRATE_RELEASES_DIR=/tmp/relcache python benchmarks/bench_ops.py [--rounds 3] [--steps 2] [--release 2.14.0]
    NPU_MIGRATE_RELEASES_DIR=/tmp/relcache python benchmarks/bench_ops.py --advise   # npu-migrate advise's run

One process. Each round runs ``examples/mnist.py --dataset digits`` under runtime migration on the
CPU twice, in alternating order: once as ``npu-migrate ops`` records it (dispatch and function
modes, the release's verdicts) and once without the recorder. Start-up is excluded: a step timer
starts at the first module forward of the script and stops at the end of its ``--steps``-th
optimizer step (then the script is ended, as the audit ends it). Prints the median time of each,
the median per-round ratio (goal: <= 3), and the time to read the release's operator list from
the cached wheel (goal: < 1 s warm) and again in the same process. With ``--advise`` the audited
run also carries ``npu-migrate advise``'s watch (:class:`npu_migrate.advise.watch.Watch`) and the
advice is built after it, inside the timed part's goal (<= 3x).
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MNIST = ROOT / "examples" / "mnist.py"


class StepTimer:
    """Times the script from its first module forward to the end of its ``steps``-th optimizer step."""

    def __init__(self, steps: int) -> None:
        self.steps, self.done, self.start, self.seconds = steps, 0, None, None
        self._handles: list[Any] = []

    def __enter__(self) -> "StepTimer":
        import torch

        optimizer = importlib.import_module("torch.optim.optimizer")

        def forward(mod: Any, inputs: Any) -> None:
            if self.start is None:
                self.start = time.perf_counter()

        def step(opt: Any, args: Any, kwargs: Any) -> None:
            from npu_migrate.ops.record import AuditDone

            self.done += 1
            if self.done >= self.steps:
                self.seconds = time.perf_counter() - self.start
                raise AuditDone("timed")

        self._handles = [torch.nn.modules.module.register_module_forward_pre_hook(forward),
                         optimizer.register_optimizer_step_post_hook(step)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()


def run_once(steps: int, judge: Any | None, advise: bool = False) -> float:
    """2 (``steps``) timed steps of the MNIST example, recorded when ``judge`` is given."""
    import contextlib

    from npu_migrate import migrate
    from npu_migrate.ops.cli import one_rank
    from npu_migrate.ops.cuda_only import Watch
    from npu_migrate.ops.record import AuditDone, Recorder

    argv, path = list(sys.argv), list(sys.path)
    timer = StepTimer(steps)
    with one_rank():
        migrate.install(device="cpu", device_count=1)
        try:
            with contextlib.ExitStack() as stack:
                if judge is not None:
                    stack.enter_context(Watch())
                    recorder = stack.enter_context(Recorder(judge, steps=None))  # the timer ends the script
                    if advise:
                        from npu_migrate.advise.watch import Watch as AdviseWatch

                        seen = stack.enter_context(AdviseWatch(recorder))
                stack.enter_context(timer)
                sys.argv = [str(MNIST), "--dataset", "digits", "--epochs", "1"]
                sys.path.insert(0, str(MNIST.parent))
                try:
                    import runpy

                    runpy.run_path(str(MNIST), run_name="__main__")
                except AuditDone:
                    pass
        finally:
            sys.argv[:], sys.path[:] = argv, path
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            migrate.uninstall()
    if timer.seconds is None:
        raise SystemExit(f"the MNIST example ended before {steps} optimizer steps")
    if advise:  # the advice is built after the run: its time counts too
        from npu_migrate.advise import report

        start = time.perf_counter()
        report.build(seen, recorder, judge.operators, os.environ)
        return timer.seconds + time.perf_counter() - start
    return timer.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="Alternating rounds (default: %(default)s).")
    parser.add_argument("--steps", type=int, default=2, help="Optimizer steps timed per run (default: %(default)s).")
    parser.add_argument("--release", default="2.14.0", help="torch-npu release judged against (default: %(default)s).")
    parser.add_argument("--advise", action="store_true", help="Audit as npu-migrate advise does (its watch too).")
    args = parser.parse_args()

    from npu_migrate import releases
    from npu_migrate.releases import operators

    release = releases.find(args.release)
    start = time.perf_counter()
    listing = operators.of_release(release)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    operators.of_release(release)
    again = time.perf_counter() - start
    print(f"operator list of torch-npu {release.version} ({len(listing.aten)} aten overloads, {release.source}): "
          f"{cold:.3f} s from the cached wheel (goal < 1 s), {again * 1e6:.0f} us again in this process")

    from npu_migrate.ops.verdict import Judge

    judge = Judge(listing)
    plain, audited, ratios = [], [], []
    for index in range(args.rounds):
        order = (False, True) if index % 2 == 0 else (True, False)
        times = {}
        for record in order:
            times[record] = run_once(args.steps, judge if record else None, args.advise and record)
        plain.append(times[False])
        audited.append(times[True])
        ratios.append(times[True] / times[False])
        print(f"round {index + 1}: unaudited {times[False] * 1e3:.1f} ms, audited {times[True] * 1e3:.1f} ms, "
              f"ratio {ratios[-1]:.2f}", flush=True)
    print(f"{args.steps} steps of examples/mnist.py: unaudited {statistics.median(plain) * 1e3:.1f} ms, "
          f"audited{' with advise' if args.advise else ''} {statistics.median(audited) * 1e3:.1f} ms "
          f"(medians of {args.rounds}); "
          f"ratio {statistics.median(ratios):.2f} (goal <= 3)")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(ROOT))
    main()
