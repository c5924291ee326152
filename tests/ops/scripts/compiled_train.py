"""A CUDA training loop in a process that has used torch.compile: --steps must still end it.

torch 2.1's dynamo strips the profiling wrapper (and with it torch's global optimizer-step hooks)
from every torch optimizer the first time it compiles, so the audit counts steps its own way.
"""

import torch

double = torch.compile(lambda x: x * 2, backend="eager")  # dynamo patches torch.optim here
double(torch.ones(2))
model = torch.nn.Linear(4, 1).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(50):
    loss = torch.special.entr(model(torch.rand(8, 4).cuda()).sigmoid()).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("ran all 50 steps")
