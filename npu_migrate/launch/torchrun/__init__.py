"""torchrun's command line, whole: its flags in every spelling and what each becomes in a job.

* :mod:`.flags`: the flags torchrun and torch_npu_run take beyond the launcher's own;
* :mod:`.settings`: what they become on one node (``--nproc-per-node auto``, the family named);
* :mod:`.rdzv`: ``--rdzv-backend``, ``--rdzv-endpoint``, ``--rdzv-conf`` and friends;
* :mod:`.logs`: torchrun's log layout (``--redirects``, ``--tee``, ``--logs-specs``);
* :mod:`.events`: ``--event-log-handler``; :mod:`.executable`: ``--no-python``.

Read by :mod:`..cli` and :mod:`..setup.config`; nothing here runs a job.
"""
