"""Recording a training run in its ranks, for ``npu-migrate compare``: ``--probe DIR`` or :class:`Probe`.

* :mod:`.probe`: the recorder: torch's global hooks, each optimizer step, the seed checkpoint.
* :mod:`.module_hooks`: the probe's per-module hooks (``--probe-level modules``): names, selection,
  each call's tensors; a component the probe holds.
* :mod:`.stats`: what is computed per tensor on its device, and how a step's statistics become records.
* :mod:`.writer`: appending the records to a rank's file: in order, whole lines, inline or from a thread.
* :mod:`.settings`: what a probe records and where: its flags, environment variables, directory checks
  (standard library only).
* :mod:`._hook`: arms the probe in a new interpreter when ``NPU_MIGRATE_PROBE`` is set (torch-free).

The records' format is :mod:`npu_migrate.compare.records`, shared with the readers. Torch is imported
by the recorder (:mod:`.probe`, :mod:`.module_hooks`, :mod:`.stats`, the writer's device fence) only.
"""
