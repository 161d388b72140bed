"""Hostile inputs: device specs, profiles, plans, bundles and run inputs (issue 12).

Every case states its expected outcome. Unless it says otherwise that is: exit code 2 and one line
on stderr that names the file and the problem, no traceback; nothing left behind (no output
written, nothing written outside the output); no hang (the module runs under a deadline per case).

The CLI runs in this process (``edgesplit.cli.main.main``: the same argument parsing, error
mapping and exit codes as the console script, without a Python start-up per case), and the model,
spec, profile, plan and bundles are built once per module, so the corpus stays fast. The tests
named ``test_defectN_...`` each failed on main before the fix of defect N.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import make_model, rand
from onnx import helper

from edgesplit.cli.main import main
from edgesplit.compile.api import compile_bundle
from edgesplit.compile.bundle import open_verified
from edgesplit.compile.manual import contiguous_plan
from edgesplit.compile.signing import generate_key
from edgesplit.errors import BundleError, DeviceSpecError, EdgesplitError, PlanError
from edgesplit.model.load import load_model
from edgesplit.profile.store import NodeCost, ProcessorProfile, Profile

pytestmark = pytest.mark.timeout(120)

SPEC = """\
name: hostile
kind: device
local: true
processors:
  cpu:
    kind: cpu
    peak_gflops: 50
    mem_bandwidth_gbps: 10
    active_w: 2
    idle_w: 0.5
    backends: [{runtime: ort}, {runtime: tvm, target: {kind: llvm}}]
  cpu2: {kind: cpu, peak_gflops: 20, mem_bandwidth_gbps: 5, active_w: 1, idle_w: 0.2, backends: [{runtime: ort}]}
"""


# ---- helpers


def cli(*args) -> tuple[int, str]:
    """Run ``edgesplit ARGS`` here; the exit code and stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


def refused(result: tuple[int, str], *needles: str, file: str | os.PathLike | None = None) -> str:
    """Exit 2 with one line naming ``file`` and holding every needle; no traceback."""
    code, err = result
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("edgesplit: error: "), err
    assert "Traceback" not in err
    for n in ([str(file)] if file is not None else []) + list(needles):
        assert n in lines[0], (n, lines[0])
    return lines[0]


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its sha256 (to show that nothing was written or removed)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_symlink() or not p.is_dir():
            out[str(p.relative_to(root))] = "special"
    return out


@contextlib.contextmanager
def nothing_written(root: Path):
    before = tree(root)
    yield
    assert tree(root) == before


def write_json(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def npy(path: Path, arr) -> Path:
    with open(path, "wb") as f:
        np.save(f, arr, allow_pickle=True)
    return path


# ---- fixtures, built once


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """The module's fixed inputs: a 4-node model, a 2-processor spec, a profile, a 2-part plan, an
    ORT bundle, and a key pair. Tests copy what they change."""
    d = tmp_path_factory.mktemp("hostile")
    model = make_model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("Relu", ["c"], ["r"], name="relu"),
            helper.make_node("Sigmoid", ["r"], ["s"], name="sig"),
            helper.make_node("Mul", ["r", "s"], ["y"], name="mul"),
        ],
        [("x", [1, 3, 8, 8])],
        [("y", [1, 4, 8, 8])],
        [("w", rand(4, 3, 3, 3))],
    )
    onnx.save(model, d / "m.onnx")
    (d / "dev.yaml").write_text(SPEC)
    graph = load_model(d / "m.onnx")
    cost = NodeCost(0.01, 0.012, "measured", 0.02, 5)
    entries = tuple(
        ProcessorProfile(proc, "ort", "measured", {n.name: cost for n in graph.nodes})
        for proc in ("cpu", "cpu2")
    )
    Profile(graph.sha256, graph.name, "hostile", graph.input_shapes(), entries).save(d / "prof.json")
    plan = contiguous_plan(graph, str(d / "dev.yaml"), [("cpu", "ort"), ("cpu2", "ort")])
    plan.save(d / "plan.json")
    compile_bundle(graph, plan, d / "bundle")
    private, public, _ = generate_key(d / "key")
    other, other_pub, _ = generate_key(d / "other")
    return {
        "dir": d,
        "model": d / "m.onnx",
        "spec": d / "dev.yaml",
        "profile": d / "prof.json",
        "plan": d / "plan.json",
        "bundle": d / "bundle",
        "key": private,
        "pub": public,
        "other": other,
        "other_pub": other_pub,
        "graph": graph,
        "plan_obj": plan,
    }


@pytest.fixture(scope="module")
def tvm_bundle(w):
    """A bundle whose first part is a TVM library, signed with the module's key."""
    plan = contiguous_plan(w["graph"], str(w["spec"]), [("cpu", "tvm"), ("cpu2", "ort")])
    out = w["dir"] / "tvm_bundle"
    m = compile_bundle(w["graph"], plan, out, sign_key=w["key"])
    assert m.parts[0].backend == "tvm", m.parts[0].note
    return out


@pytest.fixture
def bundle(w, tmp_path) -> Path:
    b = tmp_path / "b"
    shutil.copytree(w["bundle"], b)
    return b


def manifest_of(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def partition(w, tmp_path, *extra, profile=None, spec=None):
    return cli(
        "partition",
        w["model"],
        "-d",
        spec or w["spec"],
        "--profile",
        profile or w["profile"],
        "-o",
        tmp_path / "plan.json",
        "-q",
        *extra,
    )


def run(bundle, *extra):
    return cli("run", bundle, "--repeat", 1, "--warmup", 0, *extra)


# ---- defects 1-12, each by name


def test_defect1_part_name_cannot_leave_the_bundle(w, tmp_path):
    """A part named ``../../../../tmp/x`` wrote /tmp/x.onnx (exit 0); a ``/`` crashed (exit 1)."""
    target = Path("/tmp") / f"edgesplit-hostile-{os.getpid()}"
    for name in (f"../../../../{target.relative_to('/')}", "a/b", "", "p 0", "x" * 65):
        plan = json.loads(w["plan"].read_text())
        plan["parts"][0]["name"] = name
        path = write_json(tmp_path / "plan.json", plan)
        with nothing_written(tmp_path):
            r = cli("compile", w["model"], "--plan", path, "-o", tmp_path / "out")
        refused(r, "parts[0].name", "is not a valid name", file=path)
        assert not Path(f"{target}.onnx").exists() and not (tmp_path / "out").exists()
    bad = copy.deepcopy(w["plan_obj"])
    object.__setattr__(bad.parts[0], "name", "../escape")  # a Plan made in Python is checked too
    with pytest.raises(PlanError, match="not a valid name"):
        compile_bundle(w["graph"], bad, tmp_path / "out")
    assert not (tmp_path / "escape.onnx").exists()


def test_defect2_a_model_without_nodes_is_refused_and_nothing_waits(w, bundle, tmp_path):
    """A zero-node model passed partition and compile; run then waited forever. Refused (model
    loading refuses the model; plans, compile and manifests refuse zero parts): a bundle of
    nothing is a broken export, better said at once than run as an identity."""
    g = helper.make_graph(
        [],
        "g",
        [helper.make_tensor_value_info("x", 1, [1, 4])],
        [helper.make_tensor_value_info("x", 1, [1, 4])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "zero.onnx")
    r = cli("partition", tmp_path / "zero.onnx", "-d", w["spec"], "-o", tmp_path / "plan.json", "-q")
    refused(r, "nothing to split", file=tmp_path / "zero.onnx")
    assert not (tmp_path / "plan.json").exists() and not (tmp_path / "plan.profile.json").exists()
    doc = manifest_of(bundle)  # a hand-made bundle with no parts: refused at load, no wait
    doc["parts"], doc["files"] = [], {}
    write_json(bundle / "manifest.json", doc)
    refused(run(bundle), "no parts", file=bundle / "manifest.json")


def test_defect4_yaml_alias_bomb_is_refused_at_once(w, tmp_path):
    """630 bytes of nested aliases in a typed field pinned a core and grew memory 60 MB/s."""
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdef", "bcdefg"):
        lines.append(f"{name}: &{name} [{','.join([f'*{prev}'] * 9)}]")
    spec = tmp_path / "bomb.yaml"
    spec.write_text(
        "name: bomb\nkind: device\n"
        + "\n".join(lines)
        + "\nprocessors:\n  cpu: {kind: cpu, peak_gflops: *g, mem_bandwidth_gbps: 1, active_w: 1,"
        " idle_w: 1, backends: [{runtime: ort}]}\n"
    )
    assert spec.stat().st_size < 700
    refused(partition(w, tmp_path, spec=spec), "anchors and aliases", file=spec)
    with pytest.raises(DeviceSpecError, match="anchors and aliases"):
        from edgesplit.device import load_device

        load_device(spec)


def test_defect4_error_messages_quote_values_cut_short(w, tmp_path):
    spec = tmp_path / "long.yaml"
    spec.write_text(SPEC.replace("peak_gflops: 50", "peak_gflops: " + "9" * 5000 + "x"))
    line = refused(partition(w, tmp_path, spec=spec), "peak_gflops", file=spec)
    assert len(line) < 600


def test_defect8_output_dir_that_is_not_a_bundle_is_kept(w, tmp_path):
    """``compile/deploy -o DIR`` silently deleted DIR and its files."""
    out = tmp_path / "thesis"
    out.mkdir()
    (out / "chapter1.tex").write_text("years of work")
    for args in (
        ["compile", w["model"], "--plan", w["plan"], "-o", out],
        ["deploy", w["model"], "-d", w["spec"], "--profile", w["profile"], "-o", out],
    ):
        with nothing_written(tmp_path):
            refused(cli(*args), "not empty and not an edgesplit bundle", "--force", file=out)
    (tmp_path / "afile").write_text("x")
    refused(cli("compile", w["model"], "--plan", w["plan"], "-o", tmp_path / "afile"), "is a file")
    assert (tmp_path / "afile").read_text() == "x"
    assert cli("compile", w["model"], "--plan", w["plan"], "-o", out, "--force")[0] == 0
    assert not (out / "chapter1.tex").exists() and (out / "manifest.json").exists()
    assert cli("compile", w["model"], "--plan", w["plan"], "-o", out)[0] == 0  # a bundle: replaced
    (tmp_path / "empty").mkdir()
    assert cli("compile", w["model"], "--plan", w["plan"], "-o", tmp_path / "empty")[0] == 0


def test_defect8_output_never_replaces_an_input_even_with_force(w, tmp_path):
    model = tmp_path / "in" / "m.onnx"
    model.parent.mkdir()
    shutil.copy(w["model"], model)
    with nothing_written(tmp_path):
        r = cli("compile", model, "--plan", w["plan"], "-o", model.parent, "--force")
    refused(r, "would replace", file=model.parent)


def test_defect9_negative_latencies_are_refused(w, tmp_path):
    """A profile of -1000 ms per node made a plan predicting -1,000,000 ms (exit 0)."""
    prof = json.loads(w["profile"].read_text())
    for e in prof["entries"]:
        for n in e["nodes"].values():
            n["latency_ms"] = -1000.0
    path = write_json(tmp_path / "neg.json", prof)
    refused(partition(w, tmp_path, profile=path), "latency_ms", "negative", file=path)
    assert not (tmp_path / "plan.json").exists()


def test_negative_or_non_numeric_run_terms_are_refused(w, tmp_path):
    """A profile's cost terms (issue 10) are read as strictly as its node costs."""
    prof = json.loads(w["profile"].read_text())
    prof["entries"][0]["terms"] = {"part_fixed_ms": -5.0}
    path = write_json(tmp_path / "neg.json", prof)
    refused(partition(w, tmp_path, profile=path), "terms: part_fixed_ms", "negative", file=path)
    prof["entries"][0]["terms"] = {"handoff_ms": ["slow"]}
    path = write_json(tmp_path / "str.json", prof)
    refused(partition(w, tmp_path, profile=path), "terms: handoff_ms[0]", file=path)
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize(
    "flag,value",
    [("--bandwidth-mbps", "nan"), ("--bandwidth-mbps", "inf"), ("--rtt-ms", "inf"), ("--slo-ms", "nan")],
)
def test_defect9_non_finite_flags_are_usage_errors(w, tmp_path, flag, value):
    extra = [] if flag == "--slo-ms" else ["--server", "server-a100"]
    refused(partition(w, tmp_path, *extra, flag, value), flag, "not a finite number")
    assert not (tmp_path / "plan.json").exists()


def test_defect9_every_float_flag_is_finite(w, bundle, tmp_path):
    refused(cli("serve", bundle, "--max-request-mb", "inf"), "--max-request-mb", "not a finite number")
    for flag in ("--connect-timeout", "--step-timeout"):
        r = cli("profile", w["model"], "--remote", "u@127.0.0.1:9", flag, "nan", "-o", tmp_path / "p.json")
        refused(r, flag, "not a finite number")
    assert not (tmp_path / "p.json").exists()


def test_defect9_non_finite_api_arguments_are_refused(w):
    from edgesplit.pipeline import partition as api_partition

    with pytest.raises(DeviceSpecError, match="finite"):
        api_partition(
            w["graph"], w["spec"], profile=w["profile"], server="server-a100", bandwidth_mbps=math.nan
        )
    with pytest.raises(DeviceSpecError, match="finite"):
        api_partition(w["graph"], w["spec"], profile=w["profile"], server="server-a100", rtt_ms=math.inf)
    with pytest.raises(PlanError, match="slo-ms.*finite"):
        api_partition(w["graph"], w["spec"], profile=w["profile"], slo_ms=math.inf)
    with pytest.raises(PlanError, match="slo-ms.*expected a number"):
        api_partition(w["graph"], w["spec"], profile=w["profile"], slo_ms="fast")


def test_defect9_json_writers_never_write_nan(w, tmp_path):
    bad = copy.deepcopy(w["plan_obj"])
    object.__setattr__(bad, "predicted", {"latency_ms": math.inf})
    with pytest.raises(EdgesplitError, match="non-finite"):
        bad.save(tmp_path / "plan.json")
    assert not list(tmp_path.iterdir())


def test_defect10_json_nesting_bombs_are_exit_2(w, bundle, tmp_path):
    """RecursionError (exit 1) for a deeply nested profile, plan or manifest."""
    bomb = "[" * 100_000 + "]" * 100_000
    path = write_json(tmp_path / "p.json", bomb)
    refused(partition(w, tmp_path, profile=path), "nested too deeply", file=path)
    refused(cli("compile", w["model"], "--plan", path, "-o", tmp_path / "o"), "nested too deeply", file=path)
    write_json(bundle / "manifest.json", '{"a":' * 100_000 + "1" + "}" * 100_000)
    refused(run(bundle), "nested too deeply", file=bundle / "manifest.json")


def test_defect10_a_latency_given_as_a_string_names_the_node(w, tmp_path):
    prof = json.loads(w["profile"].read_text())
    prof["entries"][0]["nodes"]["conv"]["latency_ms"] = "3"
    path = write_json(tmp_path / "p.json", prof)
    refused(
        partition(w, tmp_path, profile=path), "node conv", "latency_ms", "expected a number", "'3'", file=path
    )


def test_defect10_manifest_depending_on_a_missing_part(bundle):
    doc = manifest_of(bundle)
    doc["parts"][1]["depends_on"] = ["ghost"]
    write_json(bundle / "manifest.json", doc)
    refused(run(bundle), "depends on part ghost", file=bundle / "manifest.json")


def test_defect10_an_edited_manifest_is_named_not_a_raw_ort_error(bundle):
    """The manifest's shapes edited consistently (the model input and the first part's): only the
    part's own ONNX model disagrees, and that is said naming the file, before any run."""
    doc = manifest_of(bundle)
    doc["inputs"][0]["shape"] = [1, 3, 9, 9]
    doc["parts"][0]["inputs"][0]["shape"] = [1, 3, 9, 9]
    write_json(bundle / "manifest.json", doc)
    refused(
        run(bundle), "the manifest says input 'x' of part p0 is float32 [1, 3, 9, 9]", file=bundle / "parts"
    )


@pytest.mark.parametrize("token", ["a\r\nX-Evil: 1", "two words", ""])
def test_defect10_a_token_with_cr_lf_is_a_usage_error(bundle, token):
    refused(run(bundle, "--server", "http://127.0.0.1:9", "--token", token), "--token", "visible ASCII")


def test_defect11_symlinks_in_a_bundle_are_refused(bundle, tmp_path):
    """Symlinks out of the bundle were followed (the same bytes elsewhere passed the checksum)."""
    outside = tmp_path / "elsewhere.onnx"
    shutil.copy(bundle / "parts" / "p1.onnx", outside)
    (bundle / "parts" / "p1.onnx").unlink()
    (bundle / "parts" / "p1.onnx").symlink_to(outside)
    refused(run(bundle), "a symbolic link", file=bundle / "parts" / "p1.onnx")
    (bundle / "parts" / "p1.onnx").unlink()
    shutil.move(bundle / "parts", tmp_path / "parts")
    (bundle / "parts").symlink_to(tmp_path / "parts")  # the folder, not the file
    refused(run(bundle), "a symbolic link", file=bundle / "parts")


def test_defect11_symlinked_manifest_is_refused(bundle, tmp_path):
    shutil.move(bundle / "manifest.json", tmp_path / "m.json")
    (bundle / "manifest.json").symlink_to(tmp_path / "m.json")
    refused(run(bundle), "a symbolic link", file=bundle / "manifest.json")


def test_defect11_an_edited_and_rehashed_manifest_is_refused_with_a_trust_key(w, tmp_path):
    b = tmp_path / "signed"
    assert cli("compile", w["model"], "--plan", w["plan"], "-o", b, "--sign-key", w["key"])[0] == 0
    assert run(b, "--trust-key", w["pub"])[0] == 0  # signed, unchanged: runs
    other = tmp_path / "other.onnx"  # an attacker's model in place of p1, rehashed
    shutil.copy(b / "parts" / "p1.onnx", other)
    m = onnx.load(other)
    m.graph.node[-1].op_type = "Add"
    onnx.save(m, b / "parts" / "p1.onnx")
    doc = manifest_of(b)
    doc["files"]["parts/p1.onnx"] = sha(b / "parts" / "p1.onnx")
    write_json(b / "manifest.json", doc)
    assert run(b)[0] == 0  # checksums catch accidents, not this: without a key it runs
    refused(run(b, "--trust-key", w["pub"]), "signature does not verify", file=b)
    with pytest.raises(BundleError, match="does not verify"):
        open_verified(b, trust_key=w["pub"])


def test_defect11_unsigned_or_other_key_is_refused_with_a_trust_key(w, bundle, tmp_path):
    refused(run(bundle, "--trust-key", w["pub"]), "not signed", file=bundle)
    from edgesplit.compile.bundle import sign_bundle

    sign_bundle(bundle, w["other"])
    refused(run(bundle, "--trust-key", w["pub"]), "signature does not verify", "signed by key", file=bundle)
    assert run(bundle, "--trust-key", w["other_pub"])[0] == 0
    (tmp_path / "notakey.pem").write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    refused(run(bundle, "--trust-key", tmp_path / "notakey.pem"), "not a PEM or OpenSSH public key")


def test_keygen_then_deploy_signed_then_trusted(w, tmp_path):
    """The whole signing path from the command line: keygen (private 0600, refuses to overwrite),
    deploy --sign-key, run --trust-key; an OpenSSH public key of the same pair is trusted too."""
    key = tmp_path / "release.key"
    assert cli("keygen", key)[0] == 0
    assert oct(key.stat().st_mode & 0o777) == "0o600" and Path(f"{key}.pub").exists()
    refused(cli("keygen", key), "exists", "--force", file=key)
    b = tmp_path / "b"
    r = cli("deploy", w["model"], "-d", w["spec"], "--profile", w["profile"], "-o", b, "--sign-key", key)
    assert r[0] == 0, r
    assert run(b, "--trust-key", f"{key}.pub")[0] == 0
    from cryptography.hazmat.primitives import serialization as s

    from edgesplit.compile.signing import load_private_key

    ssh_pub = load_private_key(key).public_key().public_bytes(s.Encoding.OpenSSH, s.PublicFormat.OpenSSH)
    (tmp_path / "id.pub").write_bytes(ssh_pub + b" release\n")
    assert run(b, "--trust-key", tmp_path / "id.pub")[0] == 0
    refused(
        cli("deploy", w["model"], "-d", w["spec"], "-o", tmp_path / "c", "--sign-key", tmp_path / "id.pub")
    )
    assert not (tmp_path / "c").exists()


EVIL_C = textwrap.dedent(
    """\
    #include <stdio.h>
    #include <stdlib.h>
    __attribute__((constructor)) static void pwn(void) {
        FILE *f = fopen(getenv("EDGESPLIT_TEST_MARKER"), "w");
        if (f) { fputs("the constructor ran", f); fclose(f); }
    }
    """
)


def _run_twice(bundle: Path, marker: Path, pub: Path) -> str:
    """``edgesplit run`` in a fresh process, with the trusted key and then without; after each, the
    exit code, whether the constructor ran, and whether a ``p0.so`` is mapped (``/proc/self/maps``)."""
    code = textwrap.dedent(
        f"""\
        import os, sys
        sys.stderr = sys.stdout  # the error lines in order with the rest
        from edgesplit.cli.main import main
        def attempt(*extra):
            try:
                main(['run', {str(bundle)!r}, '--repeat', '1', '--warmup', '0', *extra])
            except SystemExit as e:
                print('EXIT', e.code, flush=True)
            print('RAN' if os.path.exists({str(marker)!r}) else 'NOT-RAN', flush=True)
            print('MAPPED' if any('p0.so' in ln for ln in open('/proc/self/maps')) else 'CLEAN', flush=True)
        attempt('--trust-key', {str(pub)!r})
        print('---', flush=True)
        attempt()
        """
    )
    env = {**os.environ, "EDGESPLIT_TEST_MARKER": str(marker)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=110, env=env)
    return r.stdout + r.stderr


@pytest.mark.slow  # builds a TVM library (once for the module)
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler to build the attacker's library")
def test_defect11_a_tampered_library_is_never_mapped_with_a_trust_key(w, tvm_bundle, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(tvm_bundle, b)
    (tmp_path / "evil.c").write_text(EVIL_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", b / "parts" / "p0.so", tmp_path / "evil.c"], check=True)
    doc = manifest_of(b)
    doc["files"]["parts/p0.so"] = sha(b / "parts" / "p0.so")  # rehashed: the checksums all match
    write_json(b / "manifest.json", doc)
    out = _run_twice(b, tmp_path / "pwned", w["pub"])
    trusted, _, control = out.partition("---")
    assert "signature does not verify" in trusted and "Traceback" not in out, out
    assert "EXIT 2" in trusted and "NOT-RAN" in trusted and "CLEAN" in trusted, out
    # The control: without a trusted key, checksums do not stop this library (its constructor
    # runs), which shows that the check above would have seen it.
    assert "RAN" in control.replace("NOT-RAN", ""), out


@pytest.mark.slow  # builds a TVM library (once for the module)
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler to build the attacker's library")
def test_defect11_the_bytes_loaded_are_the_bytes_checked(w, tvm_bundle, tmp_path):
    """A file swapped after the bundle was verified (time of check to time of use) is refused
    when it is loaded: ORT parts load from the bytes hashed, TVM libraries from a private copy."""
    from edgesplit.runtime.executors import OrtExecutor, TvmExecutor

    b = tmp_path / "b"
    shutil.copytree(tvm_bundle, b)
    vb = open_verified(b, trust_key=w["pub"])
    assert vb.trusted_key
    (tmp_path / "evil.c").write_text(EVIL_C)
    (b / "parts" / "p0.so").unlink()
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", b / "parts" / "p0.so", tmp_path / "evil.c"], check=True)
    marker = tmp_path / "pwned"
    os.environ["EDGESPLIT_TEST_MARKER"] = str(marker)
    try:
        with pytest.raises(BundleError, match="p0.so: checksum mismatch"):
            TvmExecutor(vb.manifest.parts[0], vb)
    finally:
        del os.environ["EDGESPLIT_TEST_MARKER"]
    assert not marker.exists()  # the library was never loaded: its constructor did not run
    m = onnx.load(b / "parts" / "p1.onnx")
    m.graph.node[-1].op_type = "Add"
    onnx.save(m, b / "parts" / "p1.onnx")
    with pytest.raises(BundleError, match="p1.onnx: checksum mismatch"):
        OrtExecutor(vb.manifest.parts[1], vb)


def test_defect12_a_failed_partition_leaves_no_profile(w, tmp_path):
    """Measured here (no --profile), then failed at solve time: plan.profile.json was left."""
    spec = w["dir"] / "ort_only.yaml"
    spec.write_text(SPEC.replace(", {runtime: tvm, target: {kind: llvm}}", ""))
    out = tmp_path / "out"
    out.mkdir()
    r = cli("partition", w["model"], "-d", spec, "--pin", "nosuchnode=cpu", "-o", out / "plan.json", "-q")
    refused(r, "nosuchnode")
    assert sorted(p.name for p in out.iterdir()) == []


def test_defect12_compile_uses_the_plans_device_file_and_link_needs_a_server(w, tmp_path):
    assert partition(w, tmp_path)[0] == 0  # a plan made with -d FILE
    assert cli("compile", w["model"], "--plan", tmp_path / "plan.json", "-o", tmp_path / "b")[0] == 0
    r = cli(
        "deploy",
        w["model"],
        "-d",
        w["spec"],
        "--profile",
        w["profile"],
        "--link",
        "lte",
        "-o",
        tmp_path / "c",
    )
    refused(r, "need --server")
    assert not (tmp_path / "c").exists()


# ---- device specs


SPECS = {
    "nan": (SPEC.replace("peak_gflops: 50", "peak_gflops: .nan"), "peak_gflops: nan is not a finite number"),
    "inf": (SPEC.replace("mem_bandwidth_gbps: 10", "mem_bandwidth_gbps: .inf"), "inf is not a finite number"),
    "huge_int": (SPEC.replace("active_w: 2", "active_w: 1" + "0" * 400), "active_w"),
    "negative_power": (SPEC.replace("active_w: 2", "active_w: -3"), "active_w: -3 is less than the minimum"),
    "wrong_type": (SPEC.replace("peak_gflops: 50", "peak_gflops: fast"), "'fast' is not of type 'number'"),
    "unknown_key": (SPEC.replace("kind: cpu\n", "kind: cpu\n    turbo: true\n", 1), "'turbo' was unexpected"),
    "deep": (
        SPEC.replace("{runtime: ort}", "{runtime: ort, options: {a: " + "[" * 60 + "]" * 60 + "}}", 1),
        "nested more than 32 deep",
    ),
    "very_deep": ("name: x\nkind: device\nx: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    "ten_mb": (
        "name: x\nkind: device\ndescription: " + "x" * (10 << 20) + "\n",
        "more than a device spec may hold",
    ),
    "non_utf8": (b"name: \xff\xfe\nkind: device\n", "not a text file"),
    "a_small_alias": (SPEC + "servers: &s [a]\n", "anchors and aliases"),
    "top_is_a_list": ("- a\n- b\n", "expected a mapping at the top"),
    "empty": ("", "expected a mapping at the top"),
    "huge_core_number": (
        SPEC.replace("kind: cpu\n", "kind: cpu\n    cores: [99999999]\n", 1),
        "99999999 is greater than the maximum",
    ),
    "bad_yaml": ("name: [unclosed\n", "not valid YAML"),
}


@pytest.mark.parametrize("case", SPECS)
def test_a_hostile_device_spec_is_one_line(w, tmp_path, case):
    text, needle = SPECS[case]
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(text if isinstance(text, bytes) else text.encode())
    with nothing_written(tmp_path):
        refused(partition(w, tmp_path, spec=spec), needle, file=spec)


def test_a_spec_that_is_a_directory_or_missing_or_a_fifo(w, tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    refused(partition(w, tmp_path, spec=tmp_path / "dir.yaml"), "is a directory", file=tmp_path / "dir.yaml")
    refused(partition(w, tmp_path, spec=tmp_path / "none.yaml"), "no such device spec file")
    os.mkfifo(tmp_path / "fifo.yaml")  # nobody writes: reading it would wait forever
    refused(
        partition(w, tmp_path, spec=tmp_path / "fifo.yaml"), "not a regular file", file=tmp_path / "fifo.yaml"
    )


# ---- profiles


def _profile(w, edit) -> dict:
    prof = json.loads(w["profile"].read_text())
    edit(prof)
    return prof


def _set_node(field, value):
    def edit(prof):
        prof["entries"][0]["nodes"]["conv"][field] = value

    return edit


PROFILES = {
    "nan_literal": (lambda p: None, "NaN is not a number JSON allows"),
    "inf_literal": (lambda p: None, "Infinity is not a number JSON allows"),
    "overflow": (lambda p: None, "1e999 is not a finite number"),
    "wrong_model_hash": (lambda p: p.update(model_sha256="0" * 64), "the profile is for model 000000000000"),
    "unknown_backend": (lambda p: p["entries"][0].update(backend="cuda-magic"), "unknown backend cuda-magic"),
    "negative_p90": (_set_node("p90_ms", -1), "p90_ms: -1 is negative"),
    "bool_latency": (_set_node("latency_ms", True), "expected a number, got True"),
    "negative_runs": (_set_node("runs", -5), "runs: -5 is negative"),
    "fraction_runs": (_set_node("runs", 2.5), "runs: expected an integer"),
    "node_not_an_object": (lambda p: p["entries"][0]["nodes"].update(conv=[1, 2]), "not a valid profile"),
    "missing_entries_key": (lambda p: p.pop("entries"), "not a valid profile (KeyError: 'entries')"),
    "top_is_a_list": (lambda p: None, "top level is list"),
    "truncated": (lambda p: None, "not a JSON profile"),
    "wrong_format_version": (lambda p: p.update(format_version=99), "profile format version 99"),
    "negative_input_dim": (
        lambda p: p.update(input_shapes={"x": [1, -3, 8, 8]}),
        "input_shapes.x: -3 is negative",
    ),
}


@pytest.mark.parametrize("case", PROFILES)
def test_a_hostile_profile_is_one_line(w, tmp_path, case):
    edit, needle = PROFILES[case]
    text = json.dumps(_profile(w, edit))
    if case == "nan_literal":
        text = text.replace('"latency_ms": 0.01', '"latency_ms": NaN', 1)
    elif case == "inf_literal":
        text = text.replace('"latency_ms": 0.01', '"latency_ms": -Infinity', 1)
    elif case == "overflow":
        text = text.replace('"latency_ms": 0.01', '"latency_ms": 1e999', 1)
    elif case == "top_is_a_list":
        text = "[" + text + "]"
    elif case == "truncated":
        text = text[: len(text) // 2]
    path = write_json(tmp_path / "p.json", text)
    with nothing_written(tmp_path):
        refused(partition(w, tmp_path, profile=path), needle, file=path)


def test_a_huge_profile_is_refused_before_it_is_read(w, tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(300 << 20)  # sparse: costs no disk, and is never read
    refused(partition(w, tmp_path, profile=path), "more than a profile may hold", file=path)


def test_a_profile_missing_entries_is_completed_by_prediction(w, tmp_path):
    """Expected: accepted (exit 0); processors without an entry are predicted from the spec."""
    path = write_json(tmp_path / "p.json", _profile(w, lambda p: p["entries"].pop(1)))
    assert partition(w, tmp_path, profile=path)[0] == 0
    assert "Infinity" not in (tmp_path / "plan.json").read_text()


# ---- plans


def _plan(w, edit) -> dict:
    plan = json.loads(w["plan"].read_text())
    edit(plan)
    return plan


def _cycle(plan):
    plan["parts"][0]["inputs"].append(plan["parts"][1]["outputs"][0])


def _twice(plan):
    plan["parts"][1]["nodes"].append(plan["parts"][0]["nodes"][0])


def _missing(plan):
    plan["parts"][1]["nodes"].pop()
    plan["parts"][1]["outputs"] = []


PLANS = {
    "slash_in_name": (lambda p: p["parts"][0].update(name="a/b"), "is not a valid name"),
    "duplicate_names": (lambda p: p["parts"][1].update(name=p["parts"][0]["name"]), "two parts are named p0"),
    "cycle": (_cycle, "the parts depend on each other in a cycle (p0 -> p1 -> p0)"),
    "unknown_node": (lambda p: p["parts"][0]["nodes"].append("ghost"), "names nodes the model lacks: ghost"),
    "unknown_processor": (lambda p: p["parts"][0].update(processor="npu9"), "runs on processor npu9"),
    "unknown_tensor": (lambda p: p["parts"][1]["inputs"].append("ghost_t"), "names tensors the model lacks"),
    "node_twice": (_twice, "node conv is in two parts"),
    "node_in_no_part": (_missing, "node(s) of the model are in no part: mul"),
    "no_parts": (lambda p: p.update(parts=[]), "the plan has no parts"),
    "negative_latency": (
        lambda p: p["parts"][0].update(latency_ms=-1e6),
        "latency_ms: -1000000.0 is negative",
    ),
    "string_nbytes": (
        lambda p: p.update(
            transfers=[
                {
                    "tensor": "r",
                    "nbytes": "lots",
                    "src_part": "p0",
                    "dst_part": "p1",
                    "src_processor": "cpu",
                    "dst_processor": "cpu2",
                    "latency_ms": 1,
                    "energy_mj": 1,
                }
            ]
        ),
        "nbytes: expected an integer",
    ),
    "nan_predicted": (lambda p: None, "NaN is not a number JSON allows"),
    "zero_slo": (lambda p: p.update(slo_ms=0), "slo_ms: must be positive"),
    "wrong_format_version": (lambda p: p.update(format_version=7), "plan format version 7"),
    "assignment_not_a_mapping": (lambda p: p.update(assignment={"conv": 5}), "not a valid plan (TypeError"),
    "link_not_numbers": (lambda p: p.update(link={"up_mbps": "fast"}), "link.up_mbps: expected a number"),
    "output_not_written": (
        lambda p: p["parts"][0]["outputs"].append("w"),
        "lists outputs its nodes do not write: w",
    ),
    "unknown_precision": (lambda p: p["parts"][0].update(precision="int4"), "precision: int4 is not one of"),
    "precision_not_the_backends": (
        lambda p: p["parts"][0].update(precision="int8"),
        "part p0 says int8, but ort on cpu runs fp32",
    ),
    "accuracy_not_an_object": (lambda p: p.update(accuracy=[1, 2]), "accuracy: expected an object"),
    "accuracy_nan_snr": (
        lambda p: p.update(accuracy={"measured": {"snr_db": "loud", "cosine": 1, "max_abs_error": 0}}),
        "accuracy.measured: snr_db: expected a number",
    ),
    "calibration_path_not_a_string": (
        lambda p: p.update(accuracy={"calibration": {"path": 7}}),
        "accuracy.calibration.path: expected a string",
    ),
}


@pytest.mark.parametrize("case", PLANS)
def test_a_hostile_plan_is_one_line(w, tmp_path, case):
    edit, needle = PLANS[case]
    text = json.dumps(_plan(w, edit))
    if case == "nan_predicted":
        text = text.replace('"predicted": {}', '"predicted": {"latency_ms": NaN}')
        assert "NaN" in text
    path = write_json(tmp_path / "plan.json", text)
    with nothing_written(tmp_path):
        refused(cli("compile", w["model"], "--plan", path, "-o", tmp_path / "out"), needle, file=path)


# ---- bundles


def _edit_manifest(edit):
    def apply(bundle: Path) -> None:
        doc = manifest_of(bundle)
        edit(doc, bundle)
        write_json(bundle / "manifest.json", doc)

    return apply


def _outside(doc, bundle):
    (bundle.parent / "evil.onnx").write_bytes((bundle / "parts" / "p1.onnx").read_bytes())
    doc["files"]["../evil.onnx"] = sha(bundle.parent / "evil.onnx")
    doc["parts"][1]["onnx_file"] = doc["parts"][1]["file"] = "../evil.onnx"


def _fifo(bundle):
    (bundle / "parts" / "p1.onnx").unlink()
    os.mkfifo(bundle / "parts" / "p1.onnx")  # nobody writes: a blocking read would never end


BUNDLES = {
    "file_outside": (_edit_manifest(_outside), "file path '../evil.onnx' leaves the bundle"),
    "absolute_file": (
        _edit_manifest(lambda d, b: d["files"].update({"/etc/passwd": "0" * 64})),
        "leaves the bundle",
    ),
    "missing_file": (lambda b: (b / "parts" / "p1.onnx").unlink(), "p1.onnx: missing from the bundle"),
    "edited_file": (
        lambda b: (b / "parts" / "p1.onnx").write_bytes(b"\x08\x07junk"),
        "p1.onnx: checksum mismatch",
    ),
    "fifo_part": (_fifo, "p1.onnx: not a regular file"),
    "directory_part": (
        lambda b: ((b / "parts" / "p1.onnx").unlink(), (b / "parts" / "p1.onnx").mkdir()),
        "not a regular file",
    ),
    "unlisted_file": (
        _edit_manifest(lambda d, b: d["files"].pop("parts/p1.onnx")),
        "which the manifest has no checksum for",
    ),
    "wrong_format_version": (
        _edit_manifest(lambda d, b: d.update(format_version=2)),
        "manifest format version 2",
    ),
    "cycle": (_edit_manifest(lambda d, b: d["parts"][0].update(depends_on=["p1"])), "in a cycle"),
    "depends_on_itself": (
        _edit_manifest(lambda d, b: d["parts"][0].update(depends_on=["p0"])),
        "in a cycle (p0 -> p0)",
    ),
    "reads_an_unwritten_tensor": (
        _edit_manifest(lambda d, b: d["parts"][1]["inputs"][0].update(name="ghost")),
        "reads tensor ghost, which no part writes",
    ),
    "producer_shape_differs": (
        _edit_manifest(lambda d, b: d["parts"][1]["inputs"][0].update(shape=[1, 2])),
        "here but float32",
    ),
    "output_written_by_none": (
        _edit_manifest(lambda d, b: d["outputs"][0].update(name="nowhere")),
        "model output nowhere is written by no part",
    ),
    "object_dtype": (
        _edit_manifest(lambda d, b: d["inputs"][0].update(dtype="object")),
        "is not a numeric type",
    ),
    "huge_tensor": (
        _edit_manifest(lambda d, b: d["inputs"][0].update(shape=[1 << 20, 1 << 20])),
        "over 4 GiB",
    ),
    "negative_dim": (_edit_manifest(lambda d, b: d["inputs"][0].update(shape=[1, -3])), "-3 is negative"),
    "part_name_traversal": (
        _edit_manifest(lambda d, b: d["parts"][0].update(name="../p0")),
        "is not a valid name",
    ),
    "threads_as_string": (
        _edit_manifest(lambda d, b: d["parts"][0].update(threads="8")),
        "threads: expected an integer",
    ),
    "quota_over_100": (
        _edit_manifest(lambda d, b: d["parts"][0].update(cpu_quota_pct=250)),
        "cpu_quota_pct: 250",
    ),
    "unknown_precision": (
        _edit_manifest(lambda d, b: d["parts"][0].update(precision="bf8")),
        "part p0: precision: bf8 is not one of",
    ),
    "not_json": (lambda b: (b / "manifest.json").write_text("{not json"), "not a JSON manifest"),
    "missing_manifest": (lambda b: (b / "manifest.json").unlink(), "missing; "),
    "missing_key": (_edit_manifest(lambda d, b: d.pop("inputs")), "malformed manifest (KeyError: 'inputs')"),
}


@pytest.mark.parametrize("case", BUNDLES)
def test_a_hostile_bundle_is_one_line(bundle, case):
    edit, needle = BUNDLES[case]
    edit(bundle)
    with nothing_written(bundle.parent):
        refused(run(bundle), needle, file=bundle)


def test_a_bundle_path_that_is_a_file_or_missing(tmp_path):
    (tmp_path / "f").write_text("x")
    refused(run(tmp_path / "f"), "no such bundle directory", file=tmp_path / "f")
    refused(run(tmp_path / "none"), "no such bundle directory")


# ---- run inputs


def _input_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    x = np.zeros((1, 3, 8, 8), np.float32)
    (tmp / "text.npy").write_text("not an array")
    os.mkfifo(tmp / "fifo.npy")
    huge = tmp / "huge.npy"  # a header claiming 4 TB of float32, and no data
    with open(huge, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (1 << 20, 1 << 20)}
        )
    return {
        "wrong_shape": (
            [f"x={npy(tmp / 's.npy', x[:, :, :4])}"],
            "input 'x': shape (1, 3, 4, 8), expected (1, 3, 8, 8)",
        ),
        "wrong_dtype": (
            [f"x={npy(tmp / 'd.npy', x.astype(np.float64))}"],
            "input 'x': dtype float64, expected float32",
        ),
        "pickle": ([f"x={npy(tmp / 'p.npy', np.array([{'a': 1}], dtype=object))}"], "a pickle"),
        "not_a_npy": ([f"x={tmp / 'text.npy'}"], "not a .npy array"),
        "missing_file": ([f"x={tmp / 'none.npy'}"], "cannot read the input"),
        "unknown_name": ([f"nope={npy(tmp / 'n.npy', x)}"], "the bundle has no input 'nope' (inputs: x)"),
        "no_equals": (["x"], "--input 'x' is not NAME=FILE.npy"),
        "fifo": ([f"x={tmp / 'fifo.npy'}"], "not a regular file"),
        "huge_header": ([f"x={huge}"], "shape (1048576, 1048576), expected (1, 3, 8, 8)"),
        "truncated": ([f"x={tmp / 't.npy'}"], "not a readable .npy array"),
    }


INPUTS = [
    "wrong_shape",
    "wrong_dtype",
    "pickle",
    "not_a_npy",
    "missing_file",
    "unknown_name",
    "no_equals",
    "fifo",
    "huge_header",
    "truncated",
]


@pytest.mark.parametrize("case", INPUTS)
def test_a_hostile_run_input_is_one_line(bundle, tmp_path, case):
    good = npy(tmp_path / "good.npy", np.zeros((1, 3, 8, 8), np.float32))
    (tmp_path / "t.npy").write_bytes(good.read_bytes()[:-40])
    specs, needle = _input_cases(tmp_path)[case]
    args = [a for s in specs for a in ("--input", s)]
    refused(run(bundle, *args, "-o", tmp_path / "outs"), needle)
    assert not (tmp_path / "outs").exists()
    assert run(bundle, "--input", f"x={good}")[0] == 0  # the control
