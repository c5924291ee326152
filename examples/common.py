"""Plumbing shared by the examples: flags, in-memory data, the train and test loops, metrics, checkpoints.

Usage (what ``mnist.py`` does; read it first)::

    parser = argparse.ArgumentParser()
    common.add_common_args(parser, epochs=10, batch_size=64, lr=1.0)
    args = common.finish_args(parser, parser.parse_args())
    info = common.start(args)                         # logging, process group, seeds
    train_loader, test_loader = common.make_loaders(train_set, test_set, args, info)
    checkpoint = common.Checkpoint(args.checkpoint_dir, info, model=..., optimizer=..., ...)
    first = checkpoint.resume() + 1 if args.resume else 1
    for epoch in range(first, args.epochs + 1):
        train = common.train_one_epoch(model, train_loader, optimizer, scaler, F.nll_loss, info, epoch=epoch, ...)
        test = common.evaluate(raw_model, test_loader, F.nll_loss, info, ...)

``--data-dir`` and ``--checkpoint-dir`` also take ``s3://bucket/prefix`` and ``oss://bucket/prefix``
(the ``storage`` extra; credentials from the environment, see examples/README.md): remote data is
copied once per node into ``--cache-dir``, checkpoints are written to and resumed from the URL.

Nothing here names a device family: the device, its backend and its random generator all come
from ``npu_migrate``, so the examples run unchanged on NPUs, GPUs and CPUs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from tqdm import tqdm

import npu_migrate as nm
from npu_migrate.data import cache, storage
from npu_migrate.errors import StorageError
from npu_migrate.log import setup_logging

DRY_RUN_BATCHES = 2
"""Training and test batches per rank that ``--dry-run`` runs (in one epoch)."""


# --------------------------------------------------------------------------- flags


def add_common_args(parser: argparse.ArgumentParser, *, epochs: int, batch_size: int, lr: float) -> None:
    """Add the flags every example takes, with that example's defaults."""
    parser.add_argument("--data-dir", default="./data",
                        help="Datasets in torchvision's layout (default: %(default)s): a directory, downloaded "
                             "there when missing, or s3://bucket/prefix or oss://bucket/prefix.")
    parser.add_argument("--cache-dir", metavar="DIR", default=None,
                        help="Where each node keeps its copy of a remote --data-dir (default: $NPU_MIGRATE_CACHE_DIR, "
                             "else ~/.cache/npu_migrate).")
    parser.add_argument("--epochs", type=int, default=epochs, help="Epochs to train in all (default: %(default)s).")
    parser.add_argument("--batch-size", type=int, default=batch_size,
                        help="Training batch size of each process; the global batch is this times the world size (default: %(default)s).")
    parser.add_argument("--lr", type=float, default=lr, help="Learning rate (default: %(default)s).")
    parser.add_argument("--seed", type=int, default=1, help="Random seed, the same on every rank (default: %(default)s).")
    parser.add_argument("--amp", action="store_true",
                        help="Mixed precision: float16 with loss scaling on NPUs and GPUs, bfloat16 on CPUs (default: off).")
    parser.add_argument("--metrics", metavar="FILE", default=None,
                        help="Append one JSON line per epoch here, from rank 0 (default: %(default)s, none).")
    parser.add_argument("--checkpoint-dir", metavar="DIR", default=None,
                        help="Save DIR/last.pt after every epoch, atomically, from rank 0; DIR may be s3://bucket/prefix "
                             "or oss://bucket/prefix (default: %(default)s, no checkpoints).")
    parser.add_argument("--resume", action="store_true",
                        help="Continue from --checkpoint-dir's last.pt; starts from scratch if there is none yet (default: off).")
    parser.add_argument("--synthetic", action="store_true",
                        help="Train on random data of the right shape, generated offline (default: off).")
    parser.add_argument("--limit-batches", type=int, default=0, metavar="N",
                        help="Run at most N training and N test batches per rank and epoch; 0 runs them all (default: %(default)s).")
    parser.add_argument("--dry-run", action="store_true",
                        help=f"Quick check of the whole loop: one epoch of {DRY_RUN_BATCHES} training and "
                             f"{DRY_RUN_BATCHES} test batches per rank (default: off).")


def finish_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Check the shared flags and apply ``--dry-run``; usage errors exit with status 2."""
    if args.epochs < 0:
        parser.error(f"--epochs {args.epochs} is negative; pass 0 or more.")
    if args.batch_size < 1:
        parser.error(f"--batch-size {args.batch_size} must be at least 1.")
    if args.limit_batches < 0:
        parser.error(f"--limit-batches {args.limit_batches} is negative; pass 0 (all batches) or more.")
    if args.resume and not args.checkpoint_dir:
        parser.error("--resume needs --checkpoint-dir DIR, the directory that holds last.pt.")
    if args.dry_run:
        args.epochs, args.limit_batches = 1, DRY_RUN_BATCHES
    return args


def start(args: argparse.Namespace) -> nm.DistInfo:
    """Set up rank-prefixed logging, join the process group and seed every generator."""
    setup_logging()
    info = nm.init_distributed()  # torchrun's variables, or a 1-process group for `python example.py`
    nm.seed_everything(args.seed)
    return info


# --------------------------------------------------------------------------- data


class TensorData(Dataset):
    """A dataset held as whole tensors, normalised once, on the training device.

    A batch is one ``index_select`` per tensor (``__getitems__``, which DataLoader calls with a
    batch's indices), not ``batch_size`` calls to ``__getitem__``, PIL conversions and a stack.
    """

    def __init__(self, *tensors: torch.Tensor) -> None:
        if not tensors or any(len(t) != len(tensors[0]) for t in tensors):
            raise ValueError(f"TensorData needs tensors of one length, got {[len(t) for t in tensors]}.")
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[index] for t in self.tensors)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(indices, device=self.tensors[0].device)
        return tuple(t.index_select(0, index) for t in self.tensors)

    def to(self, device: torch.device) -> TensorData:
        """Move every tensor to ``device`` (once, before training)."""
        return TensorData(*(t.to(device) for t in self.tensors))


def _whole_batch(batch: Any) -> Any:
    return batch  # __getitems__ already returns a batch: nothing to collate


def make_loaders(train: TensorData, test: TensorData, args: argparse.Namespace,
                 info: nm.DistInfo) -> tuple[DataLoader, DataLoader]:
    """DataLoaders that give each rank its share of ``train`` and of ``test``.

    Training uses DistributedSampler (call ``set_epoch`` every epoch; :func:`train_one_epoch`
    does). Testing gives rank r the samples r, r + world_size, ...: no sample is repeated to
    even out the shares, as DistributedSampler would, so all-reduced test sums count each
    sample exactly once.
    """
    sampler = DistributedSampler(train, num_replicas=info.world_size, rank=info.rank, shuffle=True, seed=args.seed)
    # A loader draws a seed from its generator each time it is iterated; with its own generator
    # (saved in checkpoints) it leaves the global generator, which dropout uses, alone.
    train_loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, collate_fn=_whole_batch,
                              generator=torch.Generator().manual_seed(args.seed + info.rank))
    test_loader = DataLoader(test, batch_size=args.batch_size, sampler=range(info.rank, len(test), info.world_size),
                             collate_fn=_whole_batch, generator=torch.Generator().manual_seed(args.seed))
    return train_loader, test_loader


def synthetic_classification(shape: tuple[int, ...], classes: int, n_train: int, n_test: int) -> tuple[TensorData, TensorData]:
    """Random images that can be learnt: one random prototype per class plus noise.

    The data depend on nothing but the sizes (a fixed seed), so every rank and every run sees
    the same samples.
    """
    gen = torch.Generator().manual_seed(0)
    prototypes = torch.randn(classes, *shape, generator=gen)

    def draw(n: int) -> TensorData:
        labels = torch.randint(classes, (n,), generator=gen)
        return TensorData(prototypes[labels] + 2.0 * torch.randn(n, *shape, generator=gen), labels)

    return draw(n_train), draw(n_test)


def storage_exit(exc: StorageError, info: nm.DistInfo) -> SystemExit:
    """The one line a storage failure ends the job with: printed by rank 0, exit status 1 everywhere."""
    return SystemExit(f"error: {exc}" if info.is_main else 1)


def local_data_dir(args: argparse.Namespace, info: nm.DistInfo, include: tuple[str, ...]) -> str:
    """``--data-dir`` itself, or for ``s3://`` / ``oss://`` this node's copy of the files matching ``include``.

    Every rank calls it; local rank 0 downloads (once per node, verified, resumable) while the
    others wait.
    """
    if not storage.is_remote(args.data_dir):
        return args.data_dir
    try:
        return str(cache.fetch(args.data_dir, include=include, cache_dir=args.cache_dir))
    except StorageError as exc:
        # fetch() gave every rank the same failure: rank 0 says it before any rank ends, or the
        # launcher could stop rank 0 mid-line because another rank ended first.
        if info.is_main:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        raise SystemExit(1) from None


def load_torchvision(dataset_cls: Any, name: str, data_dir: str, info: nm.DistInfo, offline: str,
                     remote: str | None = None) -> tuple[Any, Any]:
    """Load a torchvision dataset from ``data_dir``, downloading it there on rank 0 when missing.

    Args:
        remote: the ``s3://`` or ``oss://`` URL that ``data_dir`` is the local copy of; then
            nothing is downloaded from the internet.

    Raises:
        SystemExit: with one line naming ``offline`` (the flags that need no download) when
            the data is neither there nor downloadable.
    """
    if remote is not None:
        try:
            return dataset_cls(data_dir, train=True), dataset_cls(data_dir, train=False)
        except (RuntimeError, OSError) as exc:
            raise SystemExit(
                f"error: {name} is not in {remote} in torchvision's layout ({' '.join(str(exc).split())[:120]}). "
                f"Upload it there as torchvision's {name} files, or train offline with {offline}."
                if info.is_main else 1) from None
    reason = ""
    if info.is_main:
        try:
            # torchvision prints every mirror it tries; keep that out of a one-line error.
            with contextlib.redirect_stdout(io.StringIO()):
                for train in (True, False):
                    dataset_cls(data_dir, train=train, download=True)
        except Exception as exc:  # noqa: BLE001 - URLError, RuntimeError, OSError, checksum errors...
            text = " ".join(str(exc).split())
            found = re.search(r"urlopen error ([^>]*)>", text)  # torchvision lists every mirror it tried
            reason = found.group(1) if found else text[:160]
    dist.barrier()  # the other ranks read what rank 0 downloaded
    try:
        return dataset_cls(data_dir, train=True), dataset_cls(data_dir, train=False)
    except (RuntimeError, OSError) as exc:
        why = f" (download failed: {reason})" if reason else ""
        raise SystemExit(
            f"error: {name} is not in {os.path.abspath(data_dir)} and could not be downloaded{why}. "
            f"Put it there in torchvision's layout, pass --data-dir, or train offline with {offline}."
        ) from exc


# --------------------------------------------------------------------------- train and test


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain module inside a DDP wrapper (what to save, load and evaluate)."""
    return model.module if isinstance(model, DDP) else model


def progress(iterable: Any, info: nm.DistInfo, total: int, desc: str) -> Any:
    """A tqdm bar on rank 0 only, shown when stderr is a terminal."""
    return tqdm(iterable, total=total, desc=desc, leave=False, dynamic_ncols=True,
                disable=True if not info.is_main else None)


def _batches(loader: DataLoader, limit: int) -> tuple[Iterator, int]:
    total = len(loader) if not limit else min(limit, len(loader))
    return (batch for _, batch in zip(range(total), loader)), total


def train_one_epoch(
    model: torch.nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    loss_fn: Callable[..., torch.Tensor],
    info: nm.DistInfo,
    *,
    epoch: int,
    amp: bool = False,
    limit: int = 0,
    after_backward: Callable[[torch.nn.Module], None] | None = None,
    augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, float]:
    """Train for one epoch on this rank's share of the data.

    Args:
        after_backward: called with the model between ``backward`` and the optimizer step;
            mnist.py passes its manual gradient averaging here.
        augment: applied to each input batch on the device.

    Returns:
        ``train_loss`` (mean over every sample of every rank), ``samples`` (all ranks),
        ``samples_per_sec`` (all ranks together) and ``train_s`` (the slowest rank's seconds).
    """
    model.train()
    loader.sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
    batches, total = _batches(loader, limit)
    loss_sum = torch.zeros((), device=info.device)
    seen = 0
    nm.synchronize()
    start = time.perf_counter()
    bar = progress(batches, info, total, f"epoch {epoch}")
    for step, (inputs, targets) in enumerate(bar):
        inputs = inputs.to(info.device, non_blocking=True)
        targets = targets.to(info.device, non_blocking=True)
        if augment is not None:
            inputs = augment(inputs)
        with nm.autocast(enabled=amp):
            loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if after_backward is not None:
            after_backward(model)
        scaler.step(optimizer)
        scaler.update()
        loss_sum += loss.detach().float() * len(targets)
        seen += len(targets)
        if info.is_main and step % 10 == 0 and not bar.disable:
            bar.set_postfix(loss=f"{loss.item():.4f}")  # .item() waits for the device: not every step
    nm.synchronize()
    seconds = torch.tensor([time.perf_counter() - start], device=info.device)
    totals = torch.stack([loss_sum, torch.tensor(float(seen), device=info.device)])
    dist.all_reduce(totals)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    loss_total, samples = totals.tolist()
    train_s = seconds.item()
    return {
        "train_loss": loss_total / max(samples, 1),
        "samples": int(samples),
        "samples_per_sec": samples / train_s if train_s > 0 else 0.0,
        "train_s": train_s,
    }


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    loader: DataLoader,
    loss_fn: Callable[..., torch.Tensor],
    info: nm.DistInfo,
    *,
    amp: bool = False,
    limit: int = 0,
    classify: bool = True,
) -> dict[str, float | int | None]:
    """Test on this rank's share and all-reduce sums and counts, so the figures cover every sample once.

    Args:
        model: the plain module (see :func:`unwrap`): ranks may run different numbers of
            batches, which a DDP wrapper must not see.
        loss_fn: called as ``loss_fn(output, target, reduction="sum")``.
        classify: count ``argmax == target`` for ``test_accuracy``; otherwise it is ``None``.

    Returns:
        ``test_loss`` (mean per sample), ``test_accuracy`` (0-1 or ``None``), ``test_correct``
        and ``test_samples``.
    """
    model.eval()
    batches, _ = _batches(loader, limit)
    sums = torch.zeros(3, device=info.device)  # loss, correct, samples
    for inputs, targets in batches:
        inputs = inputs.to(info.device, non_blocking=True)
        targets = targets.to(info.device, non_blocking=True)
        with nm.autocast(enabled=amp):
            output = model(inputs)
        sums[0] += loss_fn(output.float(), targets, reduction="sum")
        if classify:
            sums[1] += (output.argmax(dim=1) == targets).sum()
        sums[2] += len(targets)
    dist.all_reduce(sums)
    loss, correct, samples = sums.tolist()
    return {
        "test_loss": loss / max(samples, 1),
        "test_accuracy": correct / max(samples, 1) if classify else None,
        "test_correct": int(correct) if classify else None,
        "test_samples": int(samples),
    }


# --------------------------------------------------------------------------- checkpoints


def _device_rng_module() -> Any:
    """``torch.<family>`` when the family has its own random generator (NPUs, GPUs), else None."""
    if not nm.accelerator_available():
        return None
    module = getattr(torch, nm.device_type(), None)
    return module if hasattr(module, "get_rng_state") and hasattr(module, "set_rng_state") else None


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    """This rank's random state: Python, NumPy, torch (CPU and device) and the loader's generator.

    Only types that ``torch.load(weights_only=True)`` accepts: tensors, ints, floats, tuples.
    """
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    module = _device_rng_module()
    return {
        "python": random.getstate(),
        "numpy": (torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)),
        "torch": torch.get_rng_state(),
        "device": module.get_rng_state() if module is not None else None,
        "loader": generator.get_state(),
    }


def set_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    """Restore what :func:`rng_state` saved."""
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    module = _device_rng_module()
    if module is not None and state["device"] is not None:
        module.set_rng_state(state["device"])
    generator.set_state(state["loader"])


def _on_cpu(tree: Any) -> Any:
    """Copy the tensors of a state dict to the CPU, so the file loads on any device family."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return type(tree)((key, _on_cpu(value)) for key, value in tree.items())
    if isinstance(tree, (list, tuple)):
        return type(tree)(_on_cpu(value) for value in tree)
    return tree


class Checkpoint:
    """``DIR/last.pt``: model, optimizer, scheduler, scaler, epoch and every rank's random state.

    Saving is collective (each rank hands its random state to rank 0) and atomic: on a disk rank 0
    writes a temporary file, then renames it over ``last.pt``; in ``s3://`` or ``oss://`` it is one
    upload, which the store publishes only once complete. Either way a job killed while saving
    leaves the previous checkpoint intact. Tensors are saved from the CPU, so a checkpoint written
    on an NPU loads where torch_npu is not installed. Every rank loads the file; on several nodes,
    put DIR on storage that every node sees (a bucket does).
    """

    def __init__(self, directory: str | None, info: nm.DistInfo, *, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, scheduler: Any, scaler: Any, generator: torch.Generator) -> None:
        self.path = storage.join(directory, "last.pt") if directory else None
        self.info = info
        if self.path is not None and info.is_main:
            try:  # a wrong bucket or key should stop the job now, not after the first epoch
                storage.check_bucket(self.path)
            except StorageError as exc:
                raise storage_exit(exc, info) from None
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.generator = generator
        self.note = ""

    def save(self, epoch: int) -> None:
        """Save the state after ``epoch`` epochs (call it on every rank)."""
        if self.path is None:
            return
        states: list[Any] = [None] * self.info.world_size
        dist.all_gather_object(states, rng_state(self.generator))
        if not self.info.is_main:
            return
        checkpoint = {
            "epoch": epoch,
            "world_size": self.info.world_size,
            "model": _on_cpu(unwrap(self.model).state_dict()),
            "optimizer": _on_cpu(self.optimizer.state_dict()),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict(),
            "rng": states,
        }
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        try:
            storage.write_bytes_atomic(self.path, buffer.getvalue())
        except StorageError as exc:
            raise storage_exit(exc, self.info) from None

    def resume(self) -> int:
        """Load ``last.pt`` into everything, if it exists; return the epochs it had done (0 if none)."""
        if self.path is None:
            return 0
        try:
            data = storage.read_bytes(self.path)
        except StorageError as exc:
            if exc.kind != "missing_object":
                raise storage_exit(exc, self.info) from None
            self.note = f"no checkpoint at {self.path}; starting from scratch"
            return 0
        try:
            checkpoint = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise SystemExit(f"error: cannot read checkpoint {self.path}: {exc}. Delete it to start over.") from exc
        unwrap(self.model).load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        if self.scheduler is not None and checkpoint["scheduler"] is not None:
            self.scheduler.load_state_dict(checkpoint["scheduler"])
        self.scaler.load_state_dict(checkpoint["scaler"])
        states = checkpoint["rng"]
        if len(states) == self.info.world_size:
            set_rng_state(states[self.info.rank], self.generator)
            self.note = f"resumed from {self.path} after epoch {checkpoint['epoch']}"
        else:
            set_rng_state(states[0], self.generator)
            self.note = (f"resumed from {self.path} after epoch {checkpoint['epoch']}, saved by "
                         f"{len(states)} rank(s): the data split changes, so the run will not "
                         f"repeat an uninterrupted {len(states)}-rank run exactly")
        return int(checkpoint["epoch"])


# --------------------------------------------------------------------------- metrics


class MetricsLog:
    """JSON Lines, one row per epoch, written by rank 0 only.

    A fresh run starts the file over. A resumed run keeps the rows up to the checkpoint's
    epoch (dropping any from epochs it will repeat) and appends.
    """

    def __init__(self, path: str | None, info: nm.DistInfo, done: int, resume: bool) -> None:
        self.path = Path(path) if path and info.is_main else None
        self.info = info
        self.start = time.perf_counter()
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if resume and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("epoch", 0) <= done]
        self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, epoch: int, **figures: Any) -> dict[str, Any]:
        """Add the row of ``epoch`` (on rank 0) and return it (on every rank)."""
        row = {
            "epoch": epoch,
            **figures,
            "elapsed_s": round(time.perf_counter() - self.start, 3),
            "world_size": self.info.world_size,
            "device": self.info.device_type,
            "backend": self.info.backend,
        }
        if self.path is not None:
            with self.path.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
        return row


def epoch_line(row: dict[str, Any], epochs: int) -> str:
    """One log line for an epoch's row."""
    text = f"epoch {row['epoch']}/{epochs}: train_loss {row['train_loss']:.4f} test_loss {row['test_loss']:.4f}"
    if row.get("test_accuracy") is not None:
        text += f" test_accuracy {row['test_accuracy']:.4f} ({row['test_correct']}/{row['test_samples']})"
    return text + f" | {row['samples_per_sec']:.0f} samples/s, {row['elapsed_s']:.1f} s"
