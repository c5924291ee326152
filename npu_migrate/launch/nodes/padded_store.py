"""The launcher's view of a TCPStore: string values padded so that reading them is thread-safe.

Usage::

    store = PaddedStore(TCPStore(addr, port, ...))
    store.set("key", "value")
    store.compare_set("key", "value", "next")   # b"next"
    store.get("key")                            # b"next"
    store.add("counter", 1)                     # counters pass through unchanged
    torch_api(store.raw)                        # torch's own objects (PrefixStore) need the C++ store

Why: before torch 2.4 (pytorch/pytorch#128212), ``Store.compare_set`` built its result, a Python
``bytes``, after it had released the GIL. The launcher calls it from several threads (the heartbeat,
the rendezvous, the main loop), and so does torch's own rendezvous backend; a result allocated by
CPython's small-object allocator while another thread allocates corrupts the heap: launchers
died with SIGSEGV in 3 multi-node tests of one CI run on torch 2.1.2 under load, and a two-thread
loop of ``compare_set`` beside ordinary Python crashed every run. Objects over 512 bytes come from
the C allocator instead, which is thread-safe, and creating them touches no other shared state
(CPython <= 3.11, the Pythons of torch 2.1). So every value the launcher stores, and every value
it compares against, is padded past that size here and unpadded on the way back. The padding is
applied on every torch, so nodes agree on one format.

Counters (``add``) are integers on the wire and are never padded; ``""`` stays ``""``, which
``compare_set`` reads as "the key is absent".
"""

from __future__ import annotations

from typing import Any

_MARK = b"~npu_migrate:"
_SIZE = 600  # past CPython's small-object limit (512 bytes), with room for the header
_DIGITS = 8


def pad(value: str | bytes) -> bytes:
    """``value`` framed and padded to at least :data:`_SIZE` bytes (``""`` stays empty)."""
    body = value.encode() if isinstance(value, str) else bytes(value)
    if not body:
        return b""
    framed = _MARK + b"%0*d:" % (_DIGITS, len(body)) + body
    return framed + b" " * max(0, _SIZE - len(framed))


def unpad(raw: bytes) -> bytes:
    """The value :func:`pad` framed; anything else (a counter, an empty value) as it is."""
    if not raw.startswith(_MARK):
        return raw
    start = len(_MARK) + _DIGITS + 1
    return raw[start:start + int(raw[len(_MARK):start - 1])]


class PaddedStore:
    """A TCPStore (or PrefixStore) whose ``set``, ``get`` and ``compare_set`` pad their values.

    Every other method (``add``, ``set_timeout``, ``delete_key``...) is the store's own.
    """

    def __init__(self, store: Any) -> None:
        self.raw = store

    def set(self, key: str, value: str | bytes) -> None:
        self.raw.set(key, pad(value))

    def get(self, key: str) -> bytes:
        return unpad(self.raw.get(key))

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        return unpad(self.raw.compare_set(key, pad(expected), pad(desired)))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """Every key's value, blocking until each exists (torch's ``synchronize`` reads with it)."""
        return [unpad(raw) for raw in self.raw.multi_get(keys)]

    def wait(self, keys: list[str], *timeout: Any) -> None:
        """Block until every key exists (``wait(keys)`` or ``wait(keys, timedelta)``): keys are never
        padded, only values, so this is the store's own wait. It checks that a key exists, not its
        value."""
        self.raw.wait(keys, *timeout)

    def swap(self, key: str, stored: bytes, desired: str | bytes) -> tuple[bytes, bytes]:
        """``compare_set`` against the exact bytes ``stored`` (padded or not); returns (stored bytes, value).

        For :class:`~npu_migrate.launch.nodes.authstore.AuthStore`, which replaces a value it refused
        whatever its form (another writer need not have padded it).
        """
        now = self.raw.compare_set(key, stored, pad(desired))
        return now, unpad(now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)
