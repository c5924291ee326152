"""Third-party libraries under runtime migration: the CUDA-only ones served, the installed ones that refuse.

* :mod:`.libs_hook`: the import hook that serves :mod:`npu_migrate.libs` under flash_attn's, xformers'
  and apex's own names (what is served is :mod:`npu_migrate.libs.table`).
* :mod:`.library_failure`: a script that stopped at an installed library's CUDA check: which package,
  and the ``--user-code`` that gets past it (a failure hint).
"""
