"""A device spec's cores on a machine that lacks some of them (a spec made for another device, run
with ``--here``, or a bundle run elsewhere): the threads are pinned to the cores that exist, a
note names the others, and ORT is never asked for a core that is not there."""

from __future__ import annotations

import subprocess
import sys
import threading

from conftest import make_model, rand
from onnx import helper

from edgesplit.device.cpu import configure_thread, present_cores
from edgesplit.device.host import usable_cores

ABSENT = (4096, 4097)  # no machine here has them


def test_present_cores_keeps_the_cores_here_and_names_the_others():
    here = tuple(usable_cores())
    assert present_cores(here) == (here, None)
    assert present_cores(None) == (None, None)
    kept, note = present_cores((here[0], *ABSENT))
    assert kept == (here[0],)
    assert (
        note == f"cores {list(ABSENT)} are not on this machine (it offers {list(here)}): pinned to "
        f"[{here[0]}]"
    )
    kept, note = present_cores(ABSENT)
    assert kept is None and note.endswith(": not pinned")


def test_a_thread_configured_with_absent_cores_runs_on_the_others_and_says_so():
    box: dict[str, object] = {}

    def body() -> None:
        import os

        box["notes"] = configure_thread("cpu", (usable_cores()[0], *ABSENT), None)
        box["affinity"] = sorted(os.sched_getaffinity(0))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert box["affinity"] == [usable_cores()[0]]
    (note,) = box["notes"]
    assert note.startswith(f"cpu: cores {list(ABSENT)} are not on this machine")


RUN_SESSION = """
import sys, numpy as np, onnxruntime as ort
from edgesplit.device.cpu import ort_session_options
so = ort_session_options(3, (0, 4096, 4097))
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
s.run(None, {"x": np.ones((1, 8, 16, 16), np.float32)})
print("ran")
"""


def test_ort_is_never_asked_for_a_core_that_is_not_there(tmp_path):
    """Before, the affinities named every spec core: ORT printed ``pthread_setaffinity_np failed``
    for each thread of each session (dozens of lines for one ``profile --here``)."""
    import onnx

    conv = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    model = make_model(
        [conv], [("x", [1, 8, 16, 16])], [("y", [1, 8, 16, 16])], [("w", rand(8, 8, 3, 3))]
    )
    onnx.save(model, tmp_path / "conv.onnx")
    r = subprocess.run(
        [sys.executable, "-c", RUN_SESSION, str(tmp_path / "conv.onnx")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ran", r.stderr
    assert "setaffinity" not in r.stderr, r.stderr
