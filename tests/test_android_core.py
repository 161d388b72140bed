"""The Android demo's pure-Java core (apps/android-demo/core): its JUnit tests, and the same plan
run
by the Java core over the Open Inference Protocol against a real ``edgesplit serve`` and by the
Python runtime, which must agree within 1e-5.

Needs a JDK and Debian's junit4 (``scripts/setup.sh`` installs them as root); skips with the reason
when either is missing. The APK itself (Gradle, ONNX Runtime Android, NNAPI/XNNPACK) is not built
here: see apps/android-demo/README.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from netlab import free_port, stop_process, wait_ready

pytestmark = pytest.mark.java

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "apps" / "android-demo"
BUILD_SH = DEMO / "core" / "build.sh"
ASSETS = DEMO / "app" / "src" / "main" / "assets"
JUNIT = Path(os.environ.get("JUNIT_JAR", "/usr/share/java/junit4.jar"))
HAMCREST = Path(os.environ.get("HAMCREST_JAR", "/usr/share/java/hamcrest-core.jar"))
GSON = Path(os.environ.get("GSON_JAR", "/usr/share/java/gson.jar"))
TOKEN = "android-core-token"
# tiny_dag cut into a diamond: p1 and p2 both read p0's output and run at the same time.
DIAMOND = [
    ("p0", "big", ["stem.conv", "stem.relu"]),
    ("p1", "big", ["left.conv", "left.relu"]),
    ("p2", "little", ["right.conv"]),
    ("p3", "little", ["merge.add", "merge.concat", "pool", "flatten", "fc"]),
]


def _require_java() -> None:
    missing = [t for t in ("javac", "java") if shutil.which(t) is None]
    missing += [str(j) for j in (JUNIT, HAMCREST, GSON) if not j.is_file()]
    if missing:
        pytest.skip(
            f"no {', '.join(missing)} (bash scripts/setup.sh as root installs a JDK, junit4 and "
            "libgoogle-gson-java)"
        )


def _run(args: list[str], timeout_s: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, **kw)


@pytest.fixture(scope="module")
def core(tmp_path_factory) -> Path:
    """The core and its tests compiled by core/build.sh into a temporary folder."""
    _require_java()
    out = tmp_path_factory.mktemp("java-core")
    r = _run(["bash", str(BUILD_SH), "build"], env={**os.environ, "BUILD_DIR": str(out)})
    assert r.returncode == 0, f"core/build.sh build failed:\n{r.stdout}\n{r.stderr}"
    return out


def diamond_plan(graph):
    from edgesplit.compile.manual import contiguous_plan, part_boundaries
    from edgesplit.optimize.plan import Plan

    plan = contiguous_plan(graph, "host-biglittle", [("big", "ort")] * len(DIAMOND)).to_json()
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    groups = [[index[n] for n in nodes] for _, _, nodes in DIAMOND]
    plan["parts"] = [
        {
            "name": name,
            "processor": proc,
            "backend": "ort",
            "remote": False,
            "nodes": nodes,
            "inputs": ins,
            "outputs": outs,
        }
        for (name, proc, nodes), (ins, outs) in zip(DIAMOND, part_boundaries(graph, groups))
    ]
    plan["assignment"] = {
        n: {"processor": proc, "backend": "ort"} for _, proc, nodes in DIAMOND for n in nodes
    }
    return Plan.from_json(plan)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict:
    """A diamond bundle of tiny_dag, served with --all-parts; its input and the Python runtime's
    output."""
    from edgesplit.model import zoo
    from edgesplit.model.load import load_model
    from edgesplit.runtime.session import load
    from edgesplit.workflows.compile import compile_bundle

    d = tmp_path_factory.mktemp("served")
    graph = load_model(zoo.save("tiny_dag", d / "tiny_dag.onnx"))
    manifest = compile_bundle(graph, diamond_plan(graph), d / "bundle")
    assert [p.depends_on for p in manifest.parts] == [(), ("p0",), ("p0",), ("p0", "p1", "p2")]
    x = np.random.default_rng(7).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.save(d / "input.npy", x)
    with load(d / "bundle") as session:
        y = session.run({"input": x})["logits"]
    np.save(d / "expected.npy", y)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgesplit",
            "serve",
            str(d / "bundle"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--token",
            TOKEN,
            "--all-parts",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_ready(url, proc)
        yield {"dir": d, "bundle": d / "bundle", "url": url, "x": x, "y": y}
    finally:
        stop_process(proc)


def remote_run(core: Path, *args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "EDGESPLIT_TOKEN"}
    extra = ["--token", token] if token else []
    return _run(
        [
            "java",
            "-cp",
            f"{core / 'classes'}:{GSON}",
            "dev.edgesplit.core.RemoteRun",
            *args,
            *extra,
        ],
        env=env,
    )


def test_junit_suite_passes_against_a_real_server(core, served):
    d = served["dir"]
    r = _run(
        [
            "bash",
            str(BUILD_SH),
            "junit",
            f"-Dedgesplit.url={served['url']}",
            f"-Dedgesplit.token={TOKEN}",
            f"-Dedgesplit.bundle={served['bundle']}",
            f"-Dedgesplit.inputs=input={d / 'input.npy'}",
            f"-Dedgesplit.expected=logits={d / 'expected.npy'}",
        ],
        env={**os.environ, "BUILD_DIR": str(core)},
    )
    assert r.returncode == 0 and "OK (" in r.stdout, (
        f"JUnit failed:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    )
    assert f"LiveServerTest: against {served['url']}" in r.stdout  # the live tests ran, not skipped


def test_java_core_runs_the_plan_remotely_and_matches_python(core, served, tmp_path):
    r = remote_run(
        core,
        "--bundle",
        str(served["bundle"]),
        "--url",
        served["url"],
        "--input",
        f"input={served['dir'] / 'input.npy'}",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "logits.npy")
    assert got.dtype == np.float32 and got.shape == served["y"].shape
    np.testing.assert_allclose(got, served["y"], rtol=1e-5, atol=1e-5)
    timings = json.loads((tmp_path / "timings.json").read_text())
    assert [t["part"] for t in timings["parts"]] == ["p0", "p1", "p2", "p3"]
    assert all(
        t["ran_on"] == f"server {served['url']}" and not t["fell_back"] for t in timings["parts"]
    )
    # p3 waits for both branches; p1 and p2 only for p0.
    start = {t["part"]: t["start_ms"] for t in timings["parts"]}
    end = {t["part"]: t["start_ms"] + t["latency_ms"] for t in timings["parts"]}
    assert start["p3"] >= max(end["p1"], end["p2"]) and min(start["p1"], start["p2"]) >= end["p0"]
    assert "Model   tiny_dag" in r.stdout and "End-to-end" in r.stdout


def test_java_core_refuses_a_tampered_bundle(core, served, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(served["bundle"], bundle)
    part = bundle / "parts" / "p2.onnx"
    part.write_bytes(part.read_bytes() + b"\0")
    r = remote_run(core, "--bundle", str(bundle), "--check")
    assert r.returncode == 2
    assert (
        r.stderr.strip()
        == f"error: Bundle problem: {part}: checksum mismatch (the file was changed after compile)"
    )
    (bundle / "manifest.json").write_text('{"format_version": 2}')
    r = remote_run(core, "--bundle", str(bundle), "--check")
    assert r.returncode == 2 and "manifest format version 2, this app reads 1" in r.stderr


def test_java_core_reports_server_errors(core, served, tmp_path):
    args = [
        "--bundle",
        str(served["bundle"]),
        "--input",
        f"input={served['dir'] / 'input.npy'}",
        "--out",
        str(tmp_path),
    ]
    r = remote_run(core, *args, "--url", served["url"], token="wrong")
    assert r.returncode == 1
    assert r.stderr.strip() == (
        f"error: Server problem: part p0 (big): {served['url']}/v2/models/p0/infer: "
        f"HTTP 401: missing or wrong bearer token"
    )
    r = remote_run(core, *args, "--url", f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 1 and "cannot reach the server at" in r.stderr


def test_demo_assets_bundle_is_valid_for_both_runtimes(core):
    from edgesplit.bundle.format import open_bundle

    manifest = open_bundle(ASSETS / "bundle")  # every checksum, as the Python runtime checks it
    assert any(p.remote and p.fallback for p in manifest.parts)
    assert manifest.plan.predicted.latency_ms > 0
    r = remote_run(core, "--bundle", str(ASSETS / "bundle"), "--check", token=None)
    assert r.returncode == 0, r.stderr
    assert "ok: manifest and" in r.stdout
    committed = sum(f.stat().st_size for f in ASSETS.rglob("*") if f.is_file())
    assert committed < 1 << 20, f"the demo's assets are {committed} bytes; keep them under 1 MB"
