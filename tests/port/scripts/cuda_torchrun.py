"""A CUDA-only DDP job in the torchrun style, as users write it today (input of the port tests).

As written it needs NVIDIA GPUs. tests/port/test_end_to_end.py ports it and runs the port on CPU
with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); each rank
writes its final parameters to $OUT_DIR/rank{RANK}.json.
"""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    local_rank = int(os.environ["LOCAL_RANK"])  # set by torchrun
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).cuda()
    model = DDP(model, device_ids=[local_rank], output_device=local_rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)  # every rank its own synthetic batch
    for _ in range(5):
        x = torch.randn(16, 8, generator=data).cuda(non_blocking=True)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()

    params = [p.detach().cpu().flatten().tolist() for p in model.parameters()]
    device = str(next(model.parameters()).device)
    out = Path(os.environ.get("OUT_DIR", "."), f"rank{rank}.json")
    out.write_text(json.dumps({"rank": rank, "device": device, "loss": loss.item(), "params": params}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
