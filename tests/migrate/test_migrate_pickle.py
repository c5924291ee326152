"""Patched callables and classes pickle by their torch names, so a process without migration loads them."""

from __future__ import annotations

import functools
import io
import pickle

import torch
from torch.utils.data import DataLoader, Dataset


class Scaled(Dataset):
    """A dataset whose transform is a partial of a patched factory (pickled into spawn workers)."""

    def __init__(self) -> None:
        self.make = functools.partial(torch.tensor, dtype=torch.float64)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.make([i, 2 * i])


def test_patched_callables_and_classes_pickle_by_reference() -> None:
    from npu_migrate import migrate

    with migrate.enabled(device="cpu"):
        for obj in (torch.zeros, torch.tensor, torch.load, torch.Tensor.to, torch.nn.Module.cuda, torch.hann_window,
                    torch.Generator, torch.cuda.is_available, torch.cuda.Event, torch.cuda.Stream,
                    torch.cuda.memory.memory_allocated, torch.cuda.FloatTensor):
            assert pickle.loads(pickle.dumps(obj)) is obj, obj
        partial = pickle.loads(pickle.dumps(functools.partial(torch.zeros, 2)))
        assert partial().tolist() == [0.0, 0.0]
        event = pickle.loads(pickle.dumps(torch.cuda.Event(enable_timing=True)))
        assert isinstance(event, torch.cuda.Event)
        scalers = [torch.cuda.amp.GradScaler(init_scale=8.0)]
        if hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
            scalers.append(torch.amp.GradScaler("cuda", init_scale=8.0))
        for scaler in scalers:
            buffer = io.BytesIO()
            torch.save({"step": 3, "scaler": scaler}, buffer)  # a trainer state holding the scaler object
            buffer.seek(0)
            loaded = torch.load(buffer, weights_only=False)["scaler"]  # the user's own trusted file
            assert type(loaded).__module__.startswith("torch.") and isinstance(loaded, type(scaler).__mro__[-2])
            assert not loaded.is_enabled()  # bfloat16 AMP on cpu needs no scaling
    assert pickle.loads(pickle.dumps(torch.zeros)) is torch.zeros  # after uninstall: torch's own


def test_partial_of_a_patched_factory_reaches_spawn_workers() -> None:
    from npu_migrate import migrate

    with migrate.enabled(device="cpu"):
        loader = DataLoader(Scaled(), batch_size=2, num_workers=1, multiprocessing_context="spawn")
        batches = [b.tolist() for b in loader]
    assert batches == [[[0.0, 0.0], [1.0, 2.0]], [[2.0, 4.0], [3.0, 6.0]]]


def test_unpickling_in_a_process_without_migration_gets_torch_itself() -> None:
    from npu_migrate import migrate

    with migrate.enabled(device="cpu"):
        blobs = [pickle.dumps(o) for o in (torch.zeros, torch.Tensor.to, torch.cuda.is_available)]
    assert [pickle.loads(b) for b in blobs] == [torch.zeros, torch.Tensor.to, torch.cuda.is_available]
