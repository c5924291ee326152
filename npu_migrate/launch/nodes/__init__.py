"""The multi-node control plane: how the launchers of one job find each other, stay together and end together.

* :mod:`.servers`: the launcher's TCPStore servers (the job's address only), node 0's launcher store
  and the ranks' store on MASTER_PORT;
* :mod:`.store`: node 0's launcher store as this launcher uses it (its connections, interruptible and
  quiet calls, blocking waits and counted arrivals); :mod:`.values`: how a value sits in it (padded,
  and signed under the job secret); :mod:`.secret`: where the job secret comes from;
* :mod:`.membership` (over torch's dynamic rendezvous; the one object the supervisor holds) and
  :mod:`.assignment` (node ranks from the rendezvous): who is in the job;
* :mod:`.board`: what the launchers tell each other while the job runs; :mod:`.liveness`: is a peer there;
* :mod:`.records`: the records they exchange (failure records typed by kind, read off the wire in one
  place); :mod:`.timing`: every window, with its reason.

A one-node job uses none of it but :mod:`.servers` (its ranks' store).
"""
