"""Blocking waits on the launcher store: torch's ``synchronize`` on every torch, and counted arrivals.

Usage::

    from npu_migrate.launch.nodes import storewait

    records = storewait.synchronize(store, b"mine", rank, world, "npu_migrate/j/round/r/member/", 30)
    n = storewait.arrive(store, "npu_migrate/j/done/0")        # the n-th node to arrive sets done/0/<n>
    storewait.wait_keys(client, ["npu_migrate/j/done/0/2"], 60)  # True, False on a timeout, raises if gone
    storewait.arrived(store, "npu_migrate/j/done/0", 2)         # the signed count confirms the key

**torch's primitives.** ``torch.distributed.elastic.utils.store`` has blocking ``synchronize``
and ``barrier`` on every torch the launcher supports, with other signatures: torch 2.1 has
``synchronize(store, data, rank, world_size, key_prefix, barrier_timeout)`` and
``barrier(store, rank, world_size, key_prefix, barrier_timeout)``; newer torch renamed the first
timeout to ``timeout`` and made ``barrier(store, world_size, key_prefix, barrier_timeout, rank=None,
...)``. :func:`synchronize` and :func:`barrier` here call the running torch's with keywords.
``synchronize`` reads every node's value with ``get`` (torch 2.1) or ``multi_get`` (newer); both
go through :class:`.padded_store.PaddedStore` and :class:`.authstore.AuthStore`, so the values
come back unpadded and checked against the job secret.

**Counted arrivals** are the scheme of torch's ``barrier`` (``_barrier_nonblocking``: add one
to a counter, the last member sets a key everybody waits on) with two changes the board needs:
the n-th arrival sets ``<key>/<n>``, so a waiter can wait for *any* count (node 0 waits for the
nodes that are still in the job, a number it only knows when it waits); and the count itself is
a counter of the launcher store, signed under a job secret. ``store.wait`` checks that a key
exists, never its value: a process without the secret could set ``<key>/<n>`` itself, so where
the arrival decides something (every node finished), :func:`arrived` confirms it with the
signed count. torch's ``barrier`` waits on an unsigned key and cannot be entered again after a
timeout, which is why the board's own waits use arrivals and ``barrier`` is here for callers that
need neither.

**Connections.** A ``TCPStore`` client holds one lock for a whole request, so a blocking wait on
a shared client would stall every other call of the launcher; and a wait that timed out leaves
no answer to trust on that client. :func:`wait_keys` is given a client of its own for each wait.
"""

from __future__ import annotations

import inspect
import logging
from datetime import timedelta
from typing import Any, Sequence

logger = logging.getLogger(__name__)


def _torch_store_utils() -> Any:
    from torch.distributed.elastic.utils import store as utils

    return utils


def synchronize(store: Any, data: bytes, rank: int, world_size: int, key_prefix: str,
                timeout: float) -> list[bytes]:
    """torch's ``synchronize``: publish ``data`` as ``rank``, return every rank's (blocking, ``timeout`` s).

    Raises:
        RuntimeError: (torch's store error) a rank did not publish within ``timeout``, or the store is gone.
    """
    utils = _torch_store_utils()
    params = inspect.signature(utils.synchronize).parameters
    name = "timeout" if "timeout" in params else "barrier_timeout"  # torch 2.1: barrier_timeout
    return list(utils.synchronize(store, data, rank=rank, world_size=world_size, key_prefix=key_prefix,
                                  **{name: timeout}))


def barrier(store: Any, rank: int, world_size: int, key_prefix: str, timeout: float) -> None:
    """torch's ``barrier``: block until ``world_size`` ranks called it with ``key_prefix`` (once per prefix).

    torch 2.1 takes ``rank`` second and exchanges every rank's key; newer torch takes it as a
    keyword and only counts arrivals.
    """
    utils = _torch_store_utils()
    params = inspect.signature(utils.barrier).parameters
    if list(params)[1] == "rank":  # torch 2.1: barrier(store, rank, world_size, key_prefix, barrier_timeout)
        utils.barrier(store, rank, world_size, key_prefix, barrier_timeout=timeout)
    else:
        utils.barrier(store, world_size, key_prefix, barrier_timeout=timeout, rank=rank)


def arrival_key(key: str, n: int) -> str:
    """The key the ``n``-th arrival at ``key`` sets."""
    return f"{key}/{n}"


def arrive(store: Any, key: str) -> int:
    """Count this arrival at ``key``; return n, this one's number (``<key>/<n>`` is set)."""
    n = int(store.add(key, 1))
    store.set(arrival_key(key, n), "1")
    return n


def arrived(store: Any, key: str, n: int) -> bool:
    """Whether at least ``n`` arrivals are counted at ``key`` (a signed read under a job secret)."""
    return int(store.add(key, 0)) >= n


ABSENT = "\0npu_migrate:absent"
"""The value :func:`peek` compares with: never stored."""


def peek(store: Any, key: str) -> str | None:
    """A key's value, or None if unset, without blocking.

    torch 2.1's TCPStore has no ``check`` in Python; ``compare_set`` with an expected value that
    is never stored returns that value when the key is missing (the c10d rendezvous backend
    reads its state the same way). ``store`` is a :class:`~.padded_store.PaddedStore` (or an
    :class:`~.authstore.AuthStore` over one), so this is safe beside the launcher's other threads
    on torch < 2.4 too, and a forged value under a job secret reads as absent.
    """
    value = store.compare_set(key, ABSENT, ABSENT).decode()
    return None if value == ABSENT else value


def present(store: Any, keys: Sequence[str]) -> bool:
    """Whether every key exists (without blocking; a forged value under a secret reads as absent)."""
    return all(peek(store, k) is not None for k in keys)


def wait_keys(client: Any, keys: Sequence[str], seconds: float, check: Any = None) -> bool:
    """Block until every key exists: True; False when ``seconds`` passed first.

    Args:
        client: a store client used for this wait only (see the module docstring).
        keys: the keys to wait for.
        seconds: the longest wait.
        check: the store a timed-out wait is checked on (the keys may have come just then);
            ``client`` when None.

    Raises:
        Exception: (torch's store error) the store is gone.
    """
    if seconds > 0:
        try:
            client.wait(list(keys), timedelta(seconds=seconds))
            return True
        except Exception as exc:  # noqa: BLE001 - a timeout, or the store went away: the next read tells which
            logger.debug("wait for %s: %s", keys, exc)
    return present(client if check is None else check, keys)
