"""A training loop whose model is compiled before its first forward; each step prints its loss.

``--fullgraph`` compiles with ``fullgraph=True`` (a graph break is an error). The backend is
dynamo's ``eager``: what is traced is the subject, and no C compiler is needed.
"""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--fullgraph", action="store_true")
args = parser.parse_args()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
compiled = torch.compile(model, backend="eager", fullgraph=args.fullgraph)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = compiled(torch.ones(2, 4)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step + 1} loss {loss.item():.6f}")
