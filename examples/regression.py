"""Seed 004's ``Trainer`` on synthetic regression data, with testing, metrics and checkpoints added.

Usage::

    python -m npu_migrate.launch --device-num 2 examples/regression.py
    torchrun --nproc-per-node 2 examples/regression.py --epochs 5 --batch-size 32
    python examples/regression.py --dry-run

The data are always synthetic (``--synthetic`` is accepted for uniformity and ``--data-dir`` is
not read): 20 features, y = x . w + 0.5 + noise with a fixed w, 2048 training samples as in the
seed and 500 test samples. The model is the seed's ``Linear(20, 1)``, so the best test loss is
the noise's variance, 0.01.
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

import common
import npu_migrate as nm
from npu_migrate.log import log_rank0

logger = logging.getLogger(__name__)

FEATURES = 20
NOISE = 0.1


def regression_data(n_train: int = 2048, n_test: int = 500) -> tuple[common.TensorData, common.TensorData]:
    """Seed 004's shapes (20 features, 1 target), with a target the features can explain."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(FEATURES, 1, generator=gen)

    def draw(n: int) -> common.TensorData:
        x = torch.randn(n, FEATURES, generator=gen)
        return common.TensorData(x, x @ weight + 0.5 + NOISE * torch.randn(n, 1, generator=gen))

    return draw(n_train), draw(n_test)


class Trainer:
    """Seed 004's Trainer: ``_run_batch``, ``_run_epoch``, ``train(max_epochs)``.

    What changed: the device comes from ``npu_migrate`` instead of ``gpu_id``, the loss is MSE
    (the seed's cross-entropy does not fit a real-valued target), and ``train`` also tests,
    writes metrics and checkpoints, and resumes.
    """

    def __init__(self, model: torch.nn.Module, train_dataloader: DataLoader, test_dataloader: DataLoader,
                 optimizer: torch.optim.Optimizer, info: nm.DistInfo, args: argparse.Namespace) -> None:
        self.info = info
        self.args = args
        self.raw_model = model.to(info.device)
        self.model = DDP(self.raw_model, device_ids=info.device_ids)
        self.train_dataloader = train_dataloader
        self.test_dataloader = test_dataloader
        self.optimizer = optimizer
        self.scaler = nm.grad_scaler(enabled=args.amp)
        self.checkpoint = common.Checkpoint(args.checkpoint_dir, info, model=self.model, optimizer=optimizer,
                                            scheduler=None, scaler=self.scaler, generator=train_dataloader.generator)

    def _run_batch(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        with nm.autocast(enabled=self.args.amp):
            output = self.model(xs)
        loss = F.mse_loss(output.float(), ys)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.detach()

    def _run_epoch(self, epoch: int) -> dict[str, float]:
        common.unwrap(self.model).train()
        self.train_dataloader.sampler.set_epoch(epoch)
        limit = self.args.limit_batches or len(self.train_dataloader)
        loss_sum = torch.zeros((), device=self.info.device)
        seen = 0
        nm.synchronize()
        start = time.perf_counter()
        for step, (xs, ys) in enumerate(common.progress(self.train_dataloader, self.info, limit, f"epoch {epoch}")):
            if step == limit:
                break
            xs, ys = xs.to(self.info.device), ys.to(self.info.device)
            loss_sum += self._run_batch(xs, ys) * len(ys)
            seen += len(ys)
        nm.synchronize()
        seconds = torch.tensor([time.perf_counter() - start], device=self.info.device)
        totals = torch.stack([loss_sum, torch.tensor(float(seen), device=self.info.device)])
        dist.all_reduce(totals)  # sums over ranks: every sample counts once
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        loss_total, samples = totals.tolist()
        train_s = seconds.item()
        return {"train_loss": loss_total / max(samples, 1), "samples": int(samples),
                "samples_per_sec": samples / train_s if train_s > 0 else 0.0, "train_s": train_s}

    def train(self, max_epochs: int) -> dict | None:
        done = self.checkpoint.resume() if self.args.resume else 0
        if self.checkpoint.note:
            log_rank0(logger, "%s", self.checkpoint.note)
        metrics = common.MetricsLog(self.args.metrics, self.info, done, self.args.resume)
        row = None
        for epoch in range(done + 1, max_epochs + 1):
            train = self._run_epoch(epoch)
            test = common.evaluate(self.raw_model, self.test_dataloader, F.mse_loss, self.info,
                                   amp=self.args.amp, limit=self.args.limit_batches, classify=False)
            self.checkpoint.save(epoch)
            row = metrics.write(epoch, **train, **test, lr=self.optimizer.param_groups[0]["lr"])
            log_rank0(logger, "%s", common.epoch_line(row, max_epochs))
        return row


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(parser, epochs=10, batch_size=32, lr=0.05)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = common.finish_args(parser, parser.parse_args(argv))
    info = common.start(args)
    train_set, test_set = regression_data()
    train_set, test_set = train_set.to(info.device), test_set.to(info.device)
    train_loader, test_loader = common.make_loaders(train_set, test_set, args, info)
    log_rank0(logger, "synthetic regression: %d training and %d test samples; %d process(es) on %s with %s",
              len(train_set), len(test_set), info.world_size, info.device_type, info.backend)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    row = Trainer(model, train_loader, test_loader, optimizer, info, args).train(args.epochs)
    if row is not None:
        log_rank0(logger, "test loss %.4f (noise floor %.4f) after %d epoch(s), %d process(es) on %s",
                  row["test_loss"], NOISE**2, row["epoch"], info.world_size, info.device_type)
    nm.destroy_distributed()


if __name__ == "__main__":
    main()
