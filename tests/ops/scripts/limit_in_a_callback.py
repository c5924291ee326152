"""The --seconds limit fires inside a weakref callback (torch frees tensors through such callbacks):
an exception raised there is dropped, so the limit must fire again. Exit 3: it never did."""
import signal
import time
import weakref


class Freed:
    pass


obj = Freed()
ref = weakref.ref(obj, lambda r: signal.raise_signal(signal.SIGALRM))  # the limit, inside the callback
del obj  # the callback runs here; the AuditDone raised in it is dropped
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    pass
raise SystemExit(3)
