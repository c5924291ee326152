"""The multi-node control plane: how the launchers of one job find each other, stay together and end together.

* :mod:`.stores`: the launcher's TCPStore servers (the job's address only); :mod:`.padded_store`,
  :mod:`.storewait`: reading and waiting on them; :mod:`.authstore` and :mod:`.secret`: the job secret;
* :mod:`.jobstore`: this launcher's connections to node 0's store;
* :mod:`.membership` (over torch's dynamic rendezvous) and :mod:`.assignment` (node ranks from the
  rendezvous): who is in the job; :mod:`.rendezvous`: a node's seat;
* :mod:`.board`: what the launchers tell each other while the job runs; :mod:`.liveness`: is a peer there;
* :mod:`.records`: the records they exchange; :mod:`.timing`: every window, with its reason.

A one-node job uses none of it but :mod:`.stores` (its ranks' store).
"""
