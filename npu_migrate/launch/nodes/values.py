"""How the launcher's values sit in node 0's store: padded past 512 bytes, and signed under a job secret.

Usage::

    store = wrap(tcp_store, secret)                # PaddedStore, or AuthStore over one with a secret
    store.set("npu_migrate/<job>/abort", "why")      # padded (and signed)
    store.compare_set(key, "", "mine")              # b"mine"; a forged current value counts as absent
    store.get("key")                                # the value, unpadded (and checked)
    store.add("npu_migrate/<job>/done/0", 1)        # counters: TCPStore's own, or signed values with a secret
    torch_api(store.raw)                            # torch's own objects (PrefixStore) need the C++ store

Both wrappers are one concept, the format of a value on the wire: every launcher of the job
reads and writes its values through :func:`wrap`, so all nodes agree on it.

Padding
=======

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

Signing
=======

**Why.** Node 0's launcher store (``--port + 1``) is a plain ``TCPStore``: anyone who reaches the
port can read and write every key. torch's rendezvous keeps its state there as a pickle
(``torch.rendezvous.<job id>``, read by every launcher), and the launchers act on what the board
says (``abort``, ``fail/<gen>``, ``claim/<K>``...). Without a secret, reaching the port is
enough to run code in every launcher or end the job, exactly as with torchrun's c10d rendezvous.

**What.** With a secret (the same on every node), each value is stored as::

    ~npu_migrate-hmac1:<64 hex digits>:<value>

where the hex digits are HMAC-SHA256(secret, ``len(key)`` ``:`` key ``\\0`` value): a value
is only good under the key it was written for. A reader checks the tag with
:func:`hmac.compare_digest` before it returns the value, so torch's rendezvous backend, which
reads through this wrapper, never unpickles a value a launcher did not write. A value that fails
the check (written by a process without the secret) is refused and logged once per process:

- read by ``compare_set`` as a peek (expected == desired): the key reads as absent;
- replaced by ``compare_set`` otherwise: the attacker's value is overwritten with ours, as if
  the key held what the caller expected (so a pre-written ``abort`` or ``claim/<K>`` blocks
  nothing);
- read by ``get``: the last good value this process saw under that key is put back and
  returned; with none, :class:`UnauthenticatedValue` (a RuntimeError, which torch's backend
  reports as a store error).

**Counters.** ``TCPStore.add`` keeps an integer that cannot carry a tag, and a process without
the secret could add to it, or ``set`` it to text so that every later ``add`` fails (the board
would take that for a lost node 0). So with a secret, :meth:`AuthStore.add` is a signed decimal
updated by compare-and-set (one more round trip); ``alive/<owner>``, ``done/<gen>``,
``acked/<gen>``, ``seen/...`` and ``hang_ack/...`` are all signed. Without a secret everything
is TCPStore's own, as before.

**What it does not stop.** A process that reaches the port can still delete keys or overwrite
them with garbage (the job may then stall or fail with a store error: a denial of service, not
code execution or a forged decision), and can replay a value signed for the same key, for
instance from an earlier job with the same ``--job-id`` and secret: use a new secret, or a job
id of the scheduler, per job. ``MASTER_PORT``'s store belongs to torch's process group (as under
torchrun) and is not covered: keep both ports on a private network (docs/security.md).

The secret never leaves the launcher: it is not in any argv, file or message, nor in the
environment of a worker or (started from the command line) of the launcher itself (:mod:`.secret`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import uuid
from typing import Any, Callable

from npu_migrate.launch.errors import say

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------- padding

_PAD_MARK = b"~npu_migrate:"
_SIZE = 600  # past CPython's small-object limit (512 bytes), with room for the header
_DIGITS = 8


def pad(value: str | bytes) -> bytes:
    """``value`` framed and padded to at least :data:`_SIZE` bytes (``""`` stays empty)."""
    body = value.encode() if isinstance(value, str) else bytes(value)
    if not body:
        return b""
    framed = _PAD_MARK + b"%0*d:" % (_DIGITS, len(body)) + body
    return framed + b" " * max(0, _SIZE - len(framed))


def unpad(raw: bytes) -> bytes:
    """The value :func:`pad` framed; anything else (a counter, an empty value) as it is."""
    if not raw.startswith(_PAD_MARK):
        return raw
    start = len(_PAD_MARK) + _DIGITS + 1
    return raw[start:start + int(raw[len(_PAD_MARK):start - 1])]


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

        For :class:`AuthStore`, which replaces a value it refused
        whatever its form (another writer need not have padded it).
        """
        now = self.raw.compare_set(key, stored, pad(desired))
        return now, unpad(now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


# --------------------------------------------------------------------------- signing

_MARK = b"~npu_migrate-hmac1:"
_TAG_LEN = 64  # hex digits of SHA-256
_ABSENT = "\0npu_migrate:auth-absent"  # a peek's expected value: never stored
_CAS_TRIES = 64
"""How often one call retries a compare-and-set that others (or a forged value) got in before."""

_refused_once = threading.Event()


class UnauthenticatedValue(RuntimeError):
    """A store value not signed with the job's secret, where no good value is known to put back."""




def _tag(secret: bytes, key: str, body: bytes) -> bytes:
    name = key.encode()
    return hmac.new(secret, b"%d:%s\0" % (len(name), name) + body, hashlib.sha256).hexdigest().encode()


def sign(secret: bytes, key: str, value: str | bytes) -> bytes:
    """``value`` as stored under ``key``: tagged, or ``b""`` for the empty value."""
    body = value.encode() if isinstance(value, str) else bytes(value)
    if not body:
        return b""
    return _MARK + _tag(secret, key, body) + b":" + body


def verify(secret: bytes, key: str, raw: bytes) -> bytes | None:
    """The value ``raw`` carries if its tag is good for ``key`` (``b""`` stays empty), else None."""
    if not raw:
        return b""
    if not raw.startswith(_MARK) or len(raw) < len(_MARK) + _TAG_LEN + 1:
        return None
    tag, body = raw[len(_MARK):len(_MARK) + _TAG_LEN], raw[len(_MARK) + _TAG_LEN + 1:]
    return body if hmac.compare_digest(tag, _tag(secret, key, body)) else None


def is_signed(raw: bytes) -> bool:
    """Whether ``raw`` has the signed format (whatever the secret): for telling mismatched nodes apart."""
    return raw.startswith(_MARK)


def _refused(key: str, notify: Callable[[str], None]) -> None:
    if _refused_once.is_set():
        logger.debug("refused another unsigned value under %s", key)
        return
    _refused_once.set()
    notify(f"warning: refused a value under {key} that is not signed with this job's secret (written by a "
           "process without it); it is ignored. Keep the launcher's port on a private network.")


class AuthStore:
    """A store (a :class:`PaddedStore`) whose values are signed and checked.

    Args:
        store: the padded store to wrap; its ``raw`` (the C++ store) stays reachable as ``.raw``.
        secret: the job secret.
        notify: where the one line about a refused value goes (the launcher's console).
    """

    def __init__(self, store: PaddedStore, secret: bytes, notify: Callable[[str], None] = say) -> None:
        self.inner = store
        self.secret = secret
        self.notify = notify
        self._good: dict[str, bytes] = {}  # the last good value seen under each key
        self._lock = threading.Lock()

    @property
    def raw(self) -> Any:
        return self.inner.raw

    def _seen(self, key: str, value: bytes) -> bytes:
        with self._lock:
            self._good[key] = value
        return value

    def set(self, key: str, value: str | bytes) -> None:
        signed = sign(self.secret, key, value)
        self.inner.set(key, signed)
        self._seen(key, verify(self.secret, key, signed) or b"")

    def get(self, key: str) -> bytes:
        stored = self.inner.raw.get(key)
        raw = unpad(stored)
        for _ in range(_CAS_TRIES):
            value = verify(self.secret, key, raw)
            if value is not None:
                return self._seen(key, value)
            _refused(key, self.notify)
            with self._lock:
                good = self._good.get(key)
            if good is None:
                raise UnauthenticatedValue(f"the value under {key} is not signed with the job's secret")
            stored, raw = self.inner.swap(key, stored, sign(self.secret, key, good))  # put ours back
        raise UnauthenticatedValue(f"the value under {key} keeps changing to unsigned values")

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        expected_raw = sign(self.secret, key, expected)
        desired_raw = sign(self.secret, key, desired)
        peek = expected_raw == desired_raw
        stored = pad(expected_raw)
        for _ in range(_CAS_TRIES):
            stored, raw = self.inner.swap(key, stored, desired_raw)
            value = verify(self.secret, key, raw)
            if value is not None:
                return value if peek and raw == expected_raw else self._seen(key, value)
            _refused(key, self.notify)
            if peek:  # a read: the forged value counts as absent
                return expected.encode() if isinstance(expected, str) else bytes(expected)
            # Replace the forged value (its exact bytes), as if it were what the caller expected.
        raise UnauthenticatedValue(f"the value under {key} keeps changing to unsigned values")

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """Every key's value (blocking until each exists), each checked as :meth:`get` checks it."""
        self.inner.raw.multi_get(keys)  # blocks until every key exists
        return [self.get(key) for key in keys]

    def wait(self, keys: list[str], *timeout: Any) -> None:
        """Block until every key exists. A wait sees a key, never its value: a process without the
        secret can end it by setting the key, so a caller that decides something on it reads the
        value (or a signed counter) after it (:func:`.store.arrived`)."""
        self.inner.wait(keys, *timeout)

    def add(self, key: str, amount: int) -> int:
        """A signed counter: read, then compare-and-set ``current + amount`` until it holds.

        The value is ``"<count> <nonce>"``: two launchers adding at once write different values,
        so the one whose compare-and-set lost sees that it did and tries again.
        """
        for _ in range(_CAS_TRIES):
            current = self.compare_set(key, _ABSENT, _ABSENT).decode()
            count = 0 if current == _ABSENT else int(current.split()[0])
            if amount == 0:
                return count
            new = f"{count + amount} {uuid.uuid4().hex}"
            if self.compare_set(key, "" if current == _ABSENT else current, new).decode() == new:
                return count + amount
        raise UnauthenticatedValue(f"the counter {key} could not be updated")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def wrap(store: Any, secret: bytes | None) -> Any:
    """``store`` padded, and signed when there is a secret."""
    padded = store if isinstance(store, PaddedStore) else PaddedStore(store)
    return padded if secret is None else AuthStore(padded, secret)
