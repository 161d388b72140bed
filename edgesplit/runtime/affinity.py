"""Where a calling thread runs: the Session pins a thread that runs a part itself (a one-part
bundle's caller) to the part's cores, for one call (:func:`pin_for_call`) or until the Session
closes (:func:`keep_caller_on`, :func:`release_callers`); and the locks that keep a core group
and its members from running parts at once (:func:`core_locks`)."""

from __future__ import annotations

import contextlib
import os
import threading
import weakref


def pin_for_call(cores: frozenset[int] | None) -> set[int] | None:
    """Pin the calling thread to ``cores``; the affinity to restore after, or None when there is
    nothing to restore (no cores, or the thread is pinned there already: a caller pinned by its
    owner pays no syscall and no move)."""
    if cores is None:
        return None
    before = os.sched_getaffinity(0)
    if before == cores:
        return None
    os.sched_setaffinity(0, cores)
    return before


# While edgesplit holds a calling thread pinned: ``pin`` = [the cores, its affinity before].
CALLER = threading.local()
NOT_PINNED = (None, None)


def keep_caller_on(cores: frozenset[int] | None, owned: dict[int, tuple]) -> None:
    """Pin the calling thread to ``cores`` and leave it there until the Session that pinned it
    closes (``owned``: that Session's record, see :func:`release_callers`), as ncnn's
    ``set_cpu_powersave`` binds its caller: the next call from it pays nothing (a pin and a
    restore cost about 50 us a request here, 20% of a 0.25 ms model). ``cores`` None (a part on
    every core) gives a thread pinned here its old affinity back at once. A thread its owner
    pinned to ``cores`` is left as it is."""
    pin = getattr(CALLER, "pin", None)
    if pin is None:
        pin = CALLER.pin = [None, None]
    if pin[0] == cores:
        return
    if cores is None:
        os.sched_setaffinity(0, pin[1])
        pin[0] = None
        return
    now = os.sched_getaffinity(0)
    if pin[0] is None:
        pin[1] = now
    if now != cores:
        os.sched_setaffinity(0, cores)
    pin[0] = cores
    owned[id(pin)] = (weakref.ref(threading.current_thread()), pin, cores)


def release_callers(owned: dict[int, tuple]) -> None:
    """Give every live thread a Session still holds pinned (see :func:`keep_caller_on`) its
    affinity from before."""
    for ref, pin, cores in owned.values():
        thread = ref()
        if pin[0] == cores and thread is not None and thread.is_alive():
            with contextlib.suppress(OSError):  # it ended meanwhile
                os.sched_setaffinity(thread.native_id or 0, pin[1])
            pin[0] = None
    owned.clear()


def core_locks(parts) -> dict[int, threading.Lock]:
    """A lock for each core that two of the bundle's local processors share (a core group and its
    members)."""
    cores_of: dict[str, set[int]] = {}
    for p in parts:
        if not p.remote and p.cores:
            cores_of.setdefault(p.processor, set()).update(p.cores)
    shared: set[int] = set()
    names = sorted(cores_of)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            shared |= cores_of[a] & cores_of[b]
    return {c: threading.Lock() for c in sorted(shared)}
