"""Polling with a deadline, for tests that wait on something asynchronous
(a background process's output, a sync, a reaper): never sleep-and-hope.

The default deadline is generous on purpose: the suite runs on 2-core
machines, as root and as an ordinary user, beside VMs under TCG; a wait that
succeeds returns at once, so only a real failure pays for it. Pass a shorter
`timeout` only where the test means "soon" (and says why)."""
import time

PATIENCE = 60.0


def wait_for(fn, timeout=PATIENCE, every=0.05):
    """Poll `fn` until it returns a truthy value (returned) or the deadline
    passes (the last value is returned)."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def poll(fetch, ok, timeout=PATIENCE, every=0.05):
    """Call `fetch` until `ok(value)` holds (returns that value) or the
    deadline passes (returns None)."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(every)
