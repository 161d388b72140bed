"""A one-part bundle's request path on the calling thread, made the Session's ``run``."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from edgesplit.runtime import affinity


def caller_run(session: Any) -> Callable[..., dict[str, np.ndarray]]:
    """``Session.run`` for a one-part ONNX Runtime bundle with fixed input shapes (``_fast``),
    made that ``session``'s ``run`` (typed Any: the Session imports this module): the binding's
    run on the calling thread, the request checked after the run.

    ORT refuses another element type, rank or dimension before it computes (the model's input
    shapes are fixed: ``checks_inputs``) and an unknown name (so a dict of as many names as the
    model's has them all). After the run, a request of exactly the expected names, each a
    numpy array of exactly the expected dtype (its byte order too, which ORT takes without a
    look), is one the check first would have passed. Anything else gets the full check,
    which raises the same ``RunInputError`` for a bad request (its outputs dropped) and runs a
    converted one again. A busy part, or a ``timeout_s``, goes ``Session.run``'s general way.

    Why a closure, called as ``run`` itself: after an idle pause every Python frame and every
    object it touches costs here (an empty call took 11 us, against 0.1 us warm). In
    ``benchmarks/honest_baselines.py``'s setting (single requests after 0.1 s, tiny_dag on
    the big core, 500 interleaved requests each), the same steps as a method through helpers
    measured 1.07-1.11x ORT pinned by hand, written out in ``run`` 1.026x, and as this
    closure over its objects 0.999x. Its timings are one tuple, made records when read
    (``Session._fold_solo_runs``)."""
    run_binding, names, dtypes = session._fast
    solo = session._solo
    acquire, release = solo.idle.acquire, solo.idle.release
    cores, owned, keep = solo.cores, session._pinned_callers, affinity.keep_caller_on
    caller, not_pinned = affinity.CALLER, affinity.NOT_PINNED
    append, clock, ndarray = session._solo_runs.append, time.perf_counter_ns, np.ndarray
    n = len(dtypes)
    general = partial(type(session).run, session)

    def run(
        inputs: Mapping[str, np.ndarray], *, timeout_s: float | None = None
    ) -> dict[str, np.ndarray]:
        if timeout_s is not None or not acquire(False):
            return general(inputs, timeout_s=timeout_s)
        try:
            start_ns = clock()
            if getattr(caller, "pin", not_pinned)[0] is not cores:
                keep(cores, owned)
            raw = None
            if type(inputs) is dict and len(inputs) == n:
                run_start_ns = clock()
                try:
                    raw = run_binding(names, inputs, None)
                except Exception:  # noqa: BLE001, S110 - unchecked: the check says what was wrong
                    pass
                else:
                    for name, dtype in dtypes:
                        value = inputs[name]
                        if type(value) is not ndarray or value.dtype is not dtype:
                            raw = None
                            break
            if raw is None:
                checked = session._check_inputs(inputs)  # a bad request raises RunInputError
                run_start_ns = clock()
                raw = run_binding(names, checked, None)
            end_ns = clock()
            append((start_ns, run_start_ns, end_ns))
            return dict(zip(names, raw))
        finally:
            release()

    run.__doc__ = type(session).run.__doc__
    return run
