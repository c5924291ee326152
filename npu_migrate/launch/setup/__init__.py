"""Set-up: what one node of a job will run, from what the user and the host say, checked before anything starts.

* :mod:`.options`: the options as the user gives them (flags, ``spawn()``'s keywords);
* :mod:`.config`: one node's checked settings and the world table; :mod:`.target`: what each worker runs;
* :mod:`.cluster`: host lists, addresses, interfaces, cores; :mod:`.binding`: each rank's CPUs
  (``--cpu-binding``); :mod:`.schedulers`: which scheduler
  started the launcher and what its variables say; :mod:`.ranktable`: HCCL rank tables, and the
  wait until the scheduler has written one;
* :mod:`.ports`: the job's ports; :mod:`.hccl`: HCCL's host ports and the variables nodes share;
* :mod:`.software`: what every node must share (family, backend, torch, torch_npu);
* :mod:`.output_settings`: the output flags, checked where they enter.

Nothing here starts a process or opens a store; :mod:`..torchrun` turns torchrun's flags into these settings.
"""
