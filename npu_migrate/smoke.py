"""``npu-migrate smoke``: a tiny DDP job that proves devices, backend and collectives work.

Usage::

    npu-migrate smoke --nproc 2            # 2 processes on the detected family
    npu-migrate smoke --device cpu --steps 50

Each process joins the group through :func:`npu_migrate.init_distributed`, trains a small MLP
on its own shard of a synthetic regression problem with DDP, and the job checks that every
rank ends with the same parameters and a lower held-out loss; the command prints one summary line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from typing import Any

from npu_migrate.errors import NpuMigrateError, UsageError
from npu_migrate.log import setup_logging
from npu_migrate.registry import FAMILY_CHOICES

logger = logging.getLogger(__name__)


def train(steps: int, seed: int) -> dict[str, Any]:
    """Train the smoke model in an initialised job and return what rank 0 reports."""
    import torch  # here, not at the top: `npu-migrate --help` must not pay for torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from npu_migrate import device as _device
    from npu_migrate.distributed import init_distributed

    info = init_distributed()
    _device.seed_everything(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model = model.to(info.device)
    ddp = DDP(model, device_ids=info.device_ids)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    true_w = torch.randn(16, 1, generator=torch.Generator().manual_seed(seed))
    held_out = torch.Generator().manual_seed(seed + 10_000)  # the same batch on every rank
    x_eval = torch.randn(256, 16, generator=held_out)
    y_eval = (x_eval @ true_w).to(info.device)
    x_eval = x_eval.to(info.device)

    def eval_loss() -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(x_eval), y_eval))

    before = eval_loss()
    shard = torch.Generator().manual_seed(seed + 1 + info.rank)  # every rank its own data
    for _ in range(steps):
        x = torch.randn(64, 16, generator=shard)
        y = x @ true_w + 0.01 * torch.randn(64, 1, generator=shard)
        x, y = x.to(info.device), y.to(info.device)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(info.world_size)]
    dist.all_gather(gathered, flat)
    spread = max(float((g - flat).abs().max()) for g in gathered)
    return {
        "world_size": info.world_size,
        "device_type": info.device_type,
        "backend": info.backend,
        "loss_before": before,
        "loss_after": eval_loss(),
        "max_param_spread": spread,
    }


def _worker(local_rank: int, steps: int, seed: int, result_path: str) -> None:
    from npu_migrate.distributed import destroy_distributed

    setup_logging(logging.WARNING)
    try:
        result = train(steps, seed)
    finally:
        destroy_distributed()
    if local_rank == 0:
        with open(result_path, "w", encoding="utf-8") as fh:
            json.dump(result, fh)


def build_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Add ``smoke`` to ``subparsers`` (or make a stand-alone parser)."""
    kwargs = {"description": "Run a tiny DDP job on this node to check devices, backend and collectives."}
    if subparsers is None:
        parser = argparse.ArgumentParser(prog="npu-migrate smoke", **kwargs)
    else:
        parser = subparsers.add_parser("smoke", help="Run a tiny DDP job to check the set-up.", **kwargs)
    parser.add_argument("--nproc", "--nproc-per-node", "--nproc_per_node", type=int, default=2,
                        help="Processes to start on this node (default: %(default)s).")
    parser.add_argument("--device", default=None, choices=FAMILY_CHOICES,
                        help="Force a device family instead of NPU_MIGRATE_DEVICE or detection (auto detects).")
    parser.add_argument("--steps", type=int, default=30, help="Training steps (default: %(default)s).")
    parser.add_argument("--seed", type=int, default=0, help="Random seed (default: %(default)s).")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Validate the request, then spawn the workers."""
    if args.nproc < 1:
        raise UsageError(f"--nproc {args.nproc} is not positive: expected at least 1 process.")
    if args.steps < 1:
        raise UsageError(f"--steps {args.steps} is not positive: expected at least 1 step.")
    from npu_migrate import device as _device
    from npu_migrate.launch import spawn

    spec = _device.device_spec(args.device)
    count = _device.device_count()
    if spec.is_accelerator and args.nproc > count:
        raise UsageError(
            f"--nproc {args.nproc} is more than the {count} {spec.name} device(s) visible here. "
            f"Use --nproc {count} or fewer."
        )
    with tempfile.TemporaryDirectory(prefix="npu_migrate_smoke_") as tmp:
        result_path = os.path.join(tmp, "rank0.json")
        # The launcher's function target: torchrun's variables, a free port, and a job that
        # ends whole, naming the rank, if one fails.
        spawn(_worker, args=(args.steps, args.seed, result_path), nproc=args.nproc, device=spec.name)
        with open(result_path, encoding="utf-8") as fh:
            r = json.load(fh)
    summary = (
        f"{r['world_size']} ranks on {r['device_type']}/{r['backend']}, held-out loss "
        f"{r['loss_before']:.4f} -> {r['loss_after']:.4f}"
    )
    if r["max_param_spread"] != 0.0:
        raise NpuMigrateError(
            f"smoke job failed: {summary}, but parameters differ across ranks by up to "
            f"{r['max_param_spread']:.3g}: gradients were not averaged."
        )
    if not r["loss_after"] < r["loss_before"]:
        raise NpuMigrateError(f"smoke job failed: {summary}: training did not lower the loss.")
    print(f"smoke: ok: {summary}, parameters identical across ranks", flush=True)
    return 0
