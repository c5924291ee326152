"""Processes: this node's ranks from the fork server to their exit, and what the launcher reads of them.

* :mod:`.supervisor`: the job's phases, restarts and failure reports; :mod:`.ranks`: this node's
  workers of one attempt; :mod:`.worker`: the bootstrap in each worker; :mod:`.gloo_io`: gloo's
  transport thread on a rank bound to one CPU;
* :mod:`.forkserver`: the fork server that has torch imported, forked from the launcher where it can be;
* :mod:`.output`: the ranks' output relay; :mod:`.rundir`: the run directory;
* :mod:`.failure`: which failure is the job's first and how it reads; :mod:`.report`: the ``--error-file`` JSON;
* :mod:`.preflight`: ``--preflight``.
"""
