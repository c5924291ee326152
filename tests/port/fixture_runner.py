"""Execute ported fixtures: ``python tests/port/fixture_runner.py STYLE OUT.json FIXTURE...``.

Each ``.out.py`` fixture is a snippet as users write them, so the names it reads but does not
define (``local_rank``, ``model``, ``args``...) come from :func:`standins`: small real objects
(a ``torch.nn.Linear``, a zero tensor, an argparse namespace). It runs in a scratch directory that
holds the checkpoints the snippets load, in a one-process gloo/hccl group on 127.0.0.1 (set up by
the snippet itself when it calls ``init_process_group``). A fixture whose first line is
``# exec: raises NAME...`` is expected to raise one of those exceptions (a report-only rule whose
code stays CUDA-only): the test checks it does; ``# exec: may raise NAME...`` allows it (Triton
runs where it is installed); ``# exec: needs torch.amp.GradScaler`` skips it where torch lacks an
API the fixture's own (unported) code uses, and ``# exec: needs torch.accelerator.device_count()`` also
where calling it raises (torch 2.7's CUDA build without a driver: pytorch/pytorch#149924).

Used in-process by tests/port/test_fixtures.py (CPU tier) and as a child process with the
torch_npu stand-in first on ``PYTHONPATH`` (simulated-NPU tier); results are written as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any


def standins() -> dict[str, Any]:
    """The free names of the fixtures, as small real objects."""
    import torch

    import npu_migrate

    dev = npu_migrate.get_device()  # where the script's model and batches live

    class _Self:
        gpu_id = 0
        device = torch.device("cpu")

    args = argparse.Namespace(gpu=0, local_rank=0, cuda=False, is_cuda_build=False, device="cpu", use_gpu=False,
                              backend="gloo")
    return {
        "local_rank": 0, "rank": 0, "gpu": 0, "args": args, "self": _Self(), "use_amp": False,
        "model": torch.nn.Linear(2, 2).to(dev), "x": torch.zeros(2, device=dev), "xs": torch.zeros(2), "ys": torch.zeros(2),
        "zs": torch.zeros(2), "y": torch.zeros(2), "batch": [torch.zeros(1)], "device": torch.device("cpu"), "build_graph": lambda: None,
        "my": argparse.Namespace(cuda_device_count=lambda: 0),
        "info": argparse.Namespace(device_ids=None),
    }


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def run_one(code: str, name: str) -> dict[str, str]:
    """Execute ``code``; return ``{"status": "ok"|"raised"|"failed", "error": ...}``."""
    import torch
    import torch.distributed as dist

    needs = re.match(r"# exec: needs ([\w.]+)(\(\))?", code)
    if needs:
        import importlib

        module, _, attr = needs.group(1).rpartition(".")
        try:
            found = hasattr(importlib.import_module(module), attr)
        except ImportError:  # the module itself is newer than this torch (torch.accelerator before 2.6)
            found = False
        if not found:
            return {"status": "skipped", "error": f"the fixture's own code needs {needs.group(1)}, which torch "
                                                  f"{torch.__version__} lacks"}
        if needs.group(2):  # "needs torch.x.f()": the call itself must work on this torch and host
            try:
                getattr(importlib.import_module(module), attr)()
            except Exception as exc:  # noqa: BLE001 - reported as the reason to skip
                return {"status": "skipped", "error": f"the fixture's own code calls {needs.group(1)}(), which "
                                                      f"raises on torch {torch.__version__} here: "
                                                      f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
    expected = re.match(r"# exec: (may )?raises? ([\w ]+)", code)
    optional = bool(expected and expected.group(1))
    expected_names = set(expected.group(2).split()) if expected else set()
    old = os.getcwd()
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": _free_port(), "GLOO_SOCKET_IFNAME": "lo"}
    saved = dict(os.environ)  # the fixture's own code may set variables too (CUDA_VISIBLE_DEVICES...)
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)
        os.environ.update(env)
        for ckpt in ("a.pt", "b.pt", "c.pt", "d.pt"):
            torch.save({"w": torch.ones(2)}, ckpt)
        try:
            if "init_process_group" not in code:  # snippets that use DDP or the group expect one to exist
                import npu_migrate

                dist.init_process_group(npu_migrate.default_backend(), world_size=1, rank=0)
            exec(compile(code, name, "exec"), {"__name__": "__fixture__", **standins()})  # noqa: S102 - our fixtures
            result = {"status": "ok", "error": ""}
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            raised = {cls.__name__ for cls in type(exc).__mro__}
            kind = "raised" if raised & expected_names else "failed"
            result = {"status": kind, "error": "".join(traceback.format_exception_only(type(exc), exc)).strip()
                      + ("" if kind == "raised" else "\n" + traceback.format_exc())}
        finally:
            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
            os.chdir(old)
            os.environ.clear()
            os.environ.update(saved)
    if expected and result["status"] == "ok" and not optional:
        result = {"status": "failed", "error": f"expected {expected.group(2)}, but it ran"}
    elif not expected and result["status"] == "raised":
        result["status"] = "failed"
    return result


def main(argv: list[str]) -> int:
    style, out, *paths = argv
    results = {}
    for path in paths:
        code = Path(path).read_text()
        if style == "torch":
            from npu_migrate.port import port_source

            code = port_source(Path(path.replace(".out.py", ".in.py")).read_text(), style="torch").code
        results[Path(path).name] = run_one(code, path)
    Path(out).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
