"""NM011: integer device ordinals wherever torch takes a device, one rewrite per case (source in, source out).

Each case is a whole file with no other CUDA text, so the prefilter must find the ordinal by itself.
The executed fixtures (fixtures/NM011_*) and the 2-rank script (scripts/cuda_ordinals.py) run them.
"""

from __future__ import annotations

import pytest

from npu_migrate.port import port_source

HEAD = "import torch\n\n"
NM = "import torch\nimport npu_migrate as nm\n\n"

REWRITTEN = [
    # factory functions and classes that take a device, from torch's metadata
    ("torch.ones(1, device=local_rank)", "torch.ones(1, device=nm.get_device(local_rank))"),
    ("torch.zeros(2, 3, device=0)", "torch.zeros(2, 3, device=nm.get_device(0))"),
    ("torch.full((2,), 1.0, device=args.gpu)", "torch.full((2,), 1.0, device=nm.get_device(args.gpu))"),
    ("torch.tensor([1], device=self.local_rank)", "torch.tensor([1], device=nm.get_device(self.local_rank))"),
    ("torch.randn(3, device=gpu_id)", "torch.randn(3, device=nm.get_device(gpu_id))"),
    ("torch.empty_like(x, device=rank)", "torch.empty_like(x, device=nm.get_device(rank))"),
    ("torch.Generator(device=local_rank)", "torch.Generator(device=nm.get_device(local_rank))"),
    ("torch.nn.Linear(2, 2, device=local_rank)", "torch.nn.Linear(2, 2, device=nm.get_device(local_rank))"),
    ("torch.nn.LSTM(2, 2, device=local_rank)", "torch.nn.LSTM(2, 2, device=nm.get_device(local_rank))"),
    ("torch.fft.fftfreq(4, device=local_rank)", "torch.fft.fftfreq(4, device=nm.get_device(local_rank))"),
    ("torch.set_default_device(local_rank)", "torch.set_default_device(nm.get_device(local_rank))"),
    # tensor and module methods
    ("x.new_zeros(3, device=local_rank)", "x.new_zeros(3, device=nm.get_device(local_rank))"),
    ("model.to_empty(device=local_rank)", "model.to_empty(device=nm.get_device(local_rank))"),
    ("x.is_pinned(0)", "x.is_pinned(nm.get_device(0))"),
    ("x.to(local_rank)", "x.to(nm.get_device(local_rank))"),
    ("x.to(device=local_rank, non_blocking=True)", "x.to(device=nm.get_device(local_rank), non_blocking=True)"),
    # torch.device
    ("torch.device(local_rank)", "nm.get_device(local_rank)"),
    ("torch.device(1)", "nm.get_device(1)"),
    # torch.load
    ('torch.load("a.pt", map_location=local_rank)', 'torch.load("a.pt", map_location=nm.get_device(local_rank))'),
    ('torch.load("a.pt", local_rank)', 'torch.load("a.pt", nm.get_device(local_rank))'),
    ('torch.load("a.pt", map_location={"cpu": rank})',
     'torch.load("a.pt", map_location={"cpu": str(nm.get_device(rank))})'),
    # what an ordinal looks like
    ('torch.ones(1, device=int(os.environ["LOCAL_RANK"]))',
     'torch.ones(1, device=nm.get_device(int(os.environ["LOCAL_RANK"])))'),
    ("torch.ones(1, device=rank % 8)", "torch.ones(1, device=nm.get_device(rank % 8))"),
    ("torch.ones(1, device=LOCAL_RANK)", "torch.ones(1, device=nm.get_device(LOCAL_RANK))"),
    # the names public scripts give it: PyTorch's DDP tutorial (device_id = rank % torch.cuda.device_count()),
    # nanoGPT's ddp_local_rank, dev_id, device_idx
    ("model = ToyModel().to(device_id)", "model = ToyModel().to(nm.get_device(device_id))"),
    ("x.to(ddp_local_rank)", "x.to(nm.get_device(ddp_local_rank))"),
    ("torch.ones(1, device=dev_id)", "torch.ones(1, device=nm.get_device(dev_id))"),
    ("torch.device(args.device_idx)", "nm.get_device(args.device_idx)"),
]


@pytest.mark.parametrize(("before", "after"), REWRITTEN, ids=[b for b, _ in REWRITTEN])
def test_an_integer_device_is_ported(before: str, after: str) -> None:
    result = port_source(HEAD + before + "\n")
    assert result.code == NM + after + "\n"
    assert [c.code for c in result.changes] == ["NM011"]
    assert port_source(result.code).code == result.code  # a second port changes nothing


KEPT = [
    "torch.ones(local_rank + 1)",                    # a size
    "torch.full((2,), local_rank)",                  # a fill value
    "torch.randint(0, rank, (3,))",                  # a bound
    "torch.zeros(3, device=device)",                 # a variable: an int or a device, who knows
    "torch.zeros(3, device=ranks[0])",
    "torch.zeros(3, device=device_type)",            # a name, not an index
    "torch.zeros(3, device=rank_device)",
    "torch.Generator().manual_seed(rank)",
    "my_zeros(3, device=local_rank)",                # the user's own function
    "x.my_method(device=local_rank)",
    'torch.load("a.pt", map_location="cpu")',
    "torch.device(local_rank + 1)",                  # arithmetic other than % is not read as an ordinal
    'torch.autocast(device_type="cpu")',
    "x.to(local_rank, torch.float16)",               # .to(int, dtype) is left as before
]


@pytest.mark.parametrize("source", KEPT)
def test_what_is_not_an_ordinal_in_a_device_place_is_kept(source: str) -> None:
    result = port_source(HEAD + source + "\n")
    assert result.code == HEAD + source + "\n" and not result.changes


def test_names_bound_otherwise_are_not_torch() -> None:
    source = HEAD + (
        "from mylib import zeros\n"
        "a = zeros(3, device=rank)\n"       # not torch's zeros
        "def f(torch, int):\n"
        "    b = torch.ones(1, device=rank)\n"  # a parameter called torch
        "    return torch.device(int(rank))\n"  # and one called int
    )
    assert port_source(source).code == source


def test_from_imports_and_aliases_are_resolved() -> None:
    source = ("from torch import nn, zeros\nimport torch as T\n\n"
              "a = zeros(2, device=rank)\nb = nn.Embedding(3, 2, device=rank)\nc = T.device(0)\n")
    out = port_source(source).code
    assert "zeros(2, device=nm.get_device(rank))" in out
    assert "nn.Embedding(3, 2, device=nm.get_device(rank))" in out
    assert "c = nm.get_device(0)" in out


def test_comments_and_layout_are_kept() -> None:
    source = HEAD + (
        "x = torch.arange(\n"
        "    4,\n"
        "    device=local_rank,  # the process's GPU\n"
        ")\n"
        "d = torch.device(\n"
        "    local_rank,  # set by torchrun\n"
        ")\n"
    )
    assert port_source(source).code == NM + (
        "x = torch.arange(\n"
        "    4,\n"
        "    device=nm.get_device(local_rank),  # the process's GPU\n"
        ")\n"
        "d = nm.get_device(\n"
        "    local_rank,  # set by torchrun\n"
        ")\n"
    )


def test_an_int_map_location_says_why_it_changed() -> None:
    result = port_source(HEAD + 'ckpt = torch.load("a.pt", map_location=local_rank)\n')
    assert "TypeError" in result.changes[0].message


def test_the_other_rules_for_ordinals_still_apply() -> None:
    """.cuda(i), torch.cuda.set_device(i) and DDP's device arguments have rules of their own."""
    source = HEAD + (
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "torch.cuda.set_device(local_rank)\n"
        "y = x.cuda(local_rank)\n"
        "m = DDP(m, device_ids=[local_rank], output_device=local_rank)\n"
        'c = torch.load("a.pt", map_location=lambda storage, loc: storage.to(local_rank))\n'
    )
    result = port_source(source)
    assert "nm.set_device(local_rank)" in result.code
    assert "y = x.to(nm.get_device(local_rank))" in result.code
    assert "device_ids=nm.device_ids(local_rank), output_device=nm.output_device(local_rank)" in result.code
    assert 'torch.load("a.pt", map_location=nm.get_device(local_rank))' in result.code
    assert {c.code for c in result.changes} == {"NM001", "NM004", "NM007", "NM008", "NM011"}


def test_torch_style_writes_the_accelerator_helper() -> None:
    out = port_source(HEAD + "x = torch.ones(1, device=local_rank)\nd = torch.device(0)\n", style="torch").code
    assert "x = torch.ones(1, device=_accelerator_device(local_rank))" in out
    assert "d = _accelerator_device(0)" in out
    assert "def _accelerator_device(" in out and "npu_migrate" not in out


def test_check_reports_each_ordinal_without_rewriting() -> None:
    source = HEAD + "x = torch.ones(1, device=local_rank)\nd = torch.device(local_rank)\n"
    result = port_source(source, report_only=True)
    assert result.code == source
    assert [(f.code, f.line) for f in result.findings] == [("NM011", 3), ("NM011", 4)]


def test_only_nm011_rewrites_ordinals() -> None:
    source = HEAD + "x = torch.ones(1, device=local_rank)\n"
    assert port_source(source, ignore=["NM011"]).code == source
    assert port_source(source, select=["NM011"]).code != source
