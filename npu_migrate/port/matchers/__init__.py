"""Matchers of the port rules, grouped by area; :mod:`npu_migrate.port.rules` puts them in the table.

Usage::

    from npu_migrate.port.matchers import devices

    hit = devices.match_cuda_method(call_node, ctx)   # a Hit, or None

Each module owns one area: ``common`` (string and argument helpers), ``devices`` (device
strings, ``.cuda()``, ``torch.device``, ``is_cuda``), ``ordinals`` (integer device ordinals:
``.to(rank)``, ``device=local_rank``, ``torch.device(0)``, ``map_location=rank``), ``api`` (``torch.cuda.*``
and AMP calls through :mod:`npu_migrate.cuda_api`, availability guards), ``distributed``
(backends, DDP, visible-devices variables), ``checkpoint`` (``map_location``), ``npu``
(Ascend-only input) and ``reports`` (what only a human can port).
"""
