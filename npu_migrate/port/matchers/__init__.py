"""Matchers of the port rules, grouped by area; :mod:`npu_migrate.port.rules` puts them in the table.

Usage::

    from npu_migrate.port.matchers import devices

    hit = devices.match_cuda_method(call_node, ctx)   # a Hit, or None

Each module owns one area:

* :mod:`.common`: string and argument helpers the matchers share;
* :mod:`.devices`: device strings, ``.cuda()``, ``torch.device``, ``is_cuda``;
* :mod:`.ordinals`: integer device ordinals: ``.to(rank)``, ``device=local_rank``, ``torch.device(0)``,
  ``map_location=rank`` (NM011);
* :mod:`.api`: ``torch.cuda.*`` and AMP calls through :mod:`npu_migrate.cuda_api`, availability guards;
* :mod:`.distributed`: backends, DDP, visible-devices variables, ``NCCL_*`` names;
* :mod:`.checkpoint`: ``torch.load``'s ``map_location``;
* :mod:`.npu`: Ascend-only input (``torch_npu``, ``torch.npu.*``, ``"npu:N"``, ``"hccl"``);
* :mod:`.libs`: flash_attn, xformers and apex imports, rewritten to :mod:`npu_migrate.libs`
  (what is served: :mod:`npu_migrate.libs.table`);
* :mod:`.reports`: what only a human can port (extensions, apex's other parts, CuPy, Triton, float64...).
"""
