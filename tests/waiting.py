"""Polling with a deadline, for tests that wait on something asynchronous
(a background process's output, a sync, a reaper): never sleep-and-hope."""
import time


def wait_for(fn, timeout=15.0, every=0.05):
    """Poll `fn` until it returns a truthy value (returned) or the deadline
    passes (the last value is returned)."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def poll(fetch, ok, timeout=10.0, every=0.05):
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
