"""``--profile``: profile chosen optimizer steps of an unmodified script on every rank, on every device family.

Usage::

    python -m npu_migrate.launch --device-num 2 --profile prof train.py   # steps 3-5 of every rank
    npu-migrate run --profile prof --profile-steps 10-12 train.py
    tensorboard --logdir prof                                            # or ui.perfetto.dev

``torch.profiler`` on CPU and CUDA, ``torch_npu.profiler`` with its experimental config on the NPU;
the optimizer steps come from :mod:`npu_migrate.optim_steps`, so the script is not edited.

Modules:

* :mod:`.settings`: the flags, their checks and the variables that carry them to the ranks
  (standard library only).
* :mod:`.launch_feature`: ``--profile`` as a launcher feature.
* :mod:`._hook`: arms the recorder at a rank's ``import torch``.
* :mod:`.recorder`: in each rank, the profiler driven by the optimizer steps, its trace and
  ``rank{R}.profile.json``; imports torch.
* :mod:`.summary`: after the job, the lines naming each rank's step time, top operators and the
  slowest rank (no torch).
"""
