"""A torchrun-style job that names its GPU by integer ordinal, as users write it (input of the port tests).

Every place that takes a device gets LOCAL_RANK, an int, which torch reads as a CUDA ordinal: the
``device=`` of factory functions, of ``torch.Generator``, of an ``nn`` module and of ``new_zeros``,
``torch.device(local_rank)``, ``.to(device=local_rank)`` and ``torch.load(map_location=local_rank)``
(which torch itself calls, and fails on, as an int: the port writes the device it names). As
written it needs NVIDIA GPUs. tests/port/test_end_to_end.py ports it and runs the port on 2 CPU
ranks; each rank writes what it computed, and on which devices, to $OUT_DIR/rank{RANK}.json.
"""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist


def main():
    local_rank = int(os.environ["LOCAL_RANK"])  # set by torchrun
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(local_rank)

    ones = torch.ones(4, device=local_rank)
    ranks = torch.full((4,), float(rank), device=local_rank)
    dist.all_reduce(ranks)  # every rank: 0 + 1 + ...
    total = ones * ranks + torch.arange(4, device=local_rank)
    generator = torch.Generator(device=local_rank).manual_seed(1234)
    noise = torch.randn(3, generator=generator, device=local_rank)  # the same draw on every rank
    layer = torch.nn.Linear(3, 2, device=local_rank)
    blank = total.new_zeros(2, device=local_rank)
    mine = torch.tensor([rank * 10], device=local_rank)
    gathered = [torch.zeros(1, dtype=mine.dtype, device=local_rank) for _ in range(world)]
    dist.all_gather(gathered, mine)
    moved = torch.zeros(2).to(device=local_rank)

    checkpoint = Path(os.environ.get("OUT_DIR", "."), "total.pt")
    if rank == 0:
        torch.save({"total": total}, checkpoint)
    dist.barrier()  # rank 0 has written it
    loaded = torch.load(checkpoint, map_location=local_rank, weights_only=True)["total"]

    placed = (ones, ranks, total, noise, layer.weight, blank, *gathered, moved, loaded, torch.zeros(1).to(device))
    report = {
        "rank": rank, "devices": sorted({str(t.device) for t in placed}), "total": total.tolist(),
        "noise": noise.tolist(), "gathered": [t.item() for t in gathered], "loaded": loaded.tolist(),
        "layer": list(layer(noise).shape), "blank": blank.tolist(),
    }
    Path(os.environ.get("OUT_DIR", "."), f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
