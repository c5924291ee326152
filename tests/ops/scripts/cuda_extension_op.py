"""Trains on features made by a CUDA extension's own operator (a CUDA kernel and a meta kernel, as
flash-attn 2.6+ registers its own): neither torch-npu nor the host has a kernel for it. Audit with --meta."""
import torch
import torch.nn as nn

if not hasattr(torch.ops.npu_migrate_demo, "scaled_gelu"):  # once per process (the tests audit it twice)
    library = torch.library.Library("npu_migrate_demo", "DEF")
    library.define("scaled_gelu(Tensor x, float scale) -> Tensor")
    library.impl("scaled_gelu", lambda x, scale: nn.functional.gelu(x) * scale, "CUDA")
    library.impl("scaled_gelu", lambda x, scale: torch.empty_like(x), "Meta")
    torch.ops.npu_migrate_demo.library = library  # held: the operator goes when its Library does

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(8, 8).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    features = torch.ops.npu_migrate_demo.scaled_gelu(torch.rand(4, 8).to(device), 2.0)
    loss = model(features).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
