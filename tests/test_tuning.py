"""MetaSchedule tuning on a budget: per-task budgets, databases per target shared across models,
fail-safe lookup, progress, the profiler's fused groups, and tuning on a host over SSH.

Real TVM tuning with a few trials per kernel on models of two or three kernels; each tuning run
takes tens of seconds, so the runs are shared through module fixtures and marked slow.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import onnx
import pytest
from conftest import make_model, rand, run_cli
from onnx import helper
from sshd import remote_tmp, sshd  # noqa: F401 - fixtures

from edgesplit.backends.tvm.database import RECORDS, TARGET_FILE, find_databases, tuning_target
from edgesplit.device.host import llvm_target

PER_TASK = 2
# The evolutionary search's population: these tests are of budgets, databases and reuse, not of what
# the search finds, and the default (64 here) takes 2.8 of a tuning run's 4.6 CPU-seconds.
POPULATION = 4


def conv_model(tail: str) -> onnx.ModelProto:
    """Conv(8->8, 3x3) + ReLU, then ``tail``: the first kernel is the same workload in every
    model."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
    ]
    weights = [("w", rand(8, 8, 3, 3))]
    if tail == "matmul":
        nodes.append(helper.make_node("MatMul", ["r", "m"], ["y"], name="mm"))
        weights.append(("m", rand(16, 16, seed=1)))
    else:  # a second, different conv
        nodes.append(helper.make_node("Conv", ["r", "w2"], ["y"], pads=[0, 0, 0, 0], name="conv2"))
        weights.append(("w2", rand(8, 8, 1, 1, seed=2)))
    m = make_model(nodes, [("x", [1, 8, 16, 16])], [("y", [1, 8, 16, 16])], weights)
    onnx.checker.check_model(m)
    return m


def records_per_workload(db: Path) -> dict[int, int]:
    counts: dict[int, int] = {}
    for line in (db / RECORDS).read_text().splitlines():
        if line.strip():
            w = json.loads(line)[0]
            counts[w] = counts.get(w, 0) + 1
    return counts


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A private EDGESPLIT_CACHE for the module (the user's cache is never touched)."""
    root = tmp_path_factory.mktemp("cache")
    old = os.environ.get("EDGESPLIT_CACHE")
    os.environ["EDGESPLIT_CACHE"] = str(root)
    yield root
    if old is None:
        os.environ.pop("EDGESPLIT_CACHE", None)
    else:
        os.environ["EDGESPLIT_CACHE"] = old


@pytest.fixture(scope="module")
def first(cache, tmp_path_factory):
    """Model A tuned with PER_TASK trials per kernel, one thread; (report, progress calls,
    database)."""
    from tvm.relax.frontend.onnx import from_onnx
    from tvm.s_tir import meta_schedule as ms

    from edgesplit.backends.tvm.tune import TuneOptions, tune_module

    seen: list[tuple[str, int, int]] = []
    searches: list[int] = []  # the population each search was made with
    real = ms.search_strategy.EvolutionarySearch

    def search(*args, **kw):
        searches.append(kw["population_size"])
        return real(*args, **kw)

    mod = from_onnx(conv_model("matmul"), keep_params_in_input=False)
    options = TuneOptions(
        trials_per_task=PER_TASK, threads=1, builder_workers=1, population=POPULATION
    )
    ms.search_strategy.EvolutionarySearch = search
    try:
        _, report = tune_module(mod, llvm_target(), options, lambda *a: seen.append(a))
    finally:
        ms.search_strategy.EvolutionarySearch = real
    return report, seen, Path(report.database), searches


@pytest.mark.slow
def test_the_per_task_budget_is_respected(first):
    report, _, db, searches = first
    counts = records_per_workload(db)
    assert report.tasks == 2 and report.tuned == 2 and report.reused == 0
    assert sorted(counts.values()) == [PER_TASK, PER_TASK]  # every trial is one record
    assert report.trials == 2 * PER_TASK
    assert (
        db == Path(os.environ["EDGESPLIT_CACHE"]) / "tvm-tuning" / db.name
    )  # the target's cache folder
    assert json.loads((db / TARGET_FILE).read_text())["target"] == tuning_target(llvm_target(), 1)
    assert searches and set(searches) == {POPULATION} and report.population == POPULATION


@pytest.mark.slow
def test_progress_reaches_all_trials(first):
    report, seen, _, _ = first
    assert seen[0][1:] == (0, 2 * PER_TASK) and seen[-1][1:] == (2 * PER_TASK, 2 * PER_TASK)
    done = [d for _, d, _ in seen]
    assert done == sorted(done)  # never goes back


@pytest.mark.slow
def test_a_kernel_shared_with_another_model_is_not_tuned_again(first):
    """Model B shares model A's conv+relu: B's run tunes only its own second conv."""
    from tvm.relax.frontend.onnx import from_onnx

    from edgesplit.backends.tvm.tune import TuneOptions, tune_module

    _, _, db, _ = first
    before = records_per_workload(db)
    mod = from_onnx(conv_model("conv"), keep_params_in_input=False)
    options = TuneOptions(
        trials_per_task=PER_TASK, threads=1, builder_workers=1, population=POPULATION
    )
    _, report = tune_module(mod, llvm_target(), options)
    after = records_per_workload(db)
    assert (report.tasks, report.reused, report.tuned, report.trials) == (2, 1, 1, PER_TASK)
    assert {w: n for w, n in after.items() if w in before} == before  # nothing new for A's kernels
    assert sorted(n for w, n in after.items() if w not in before) == [PER_TASK]


@pytest.mark.slow
def test_builds_and_profiles_apply_the_database_of_their_target_only(first, tmp_path):
    from edgesplit.backends.tvm.build import build_library

    _, _, db, _ = first
    model = conv_model("matmul")
    info = build_library(model, llvm_target(), tmp_path / "a.so", threads=1)
    assert info["tuning_database"] == str(db)
    # the same target with another thread count is another tuning target: nothing to apply
    assert "tuning_database" not in build_library(
        model, llvm_target(), tmp_path / "b.so", threads=3
    )
    # a copy that says it was tuned for another CPU is refused, even when named explicitly
    other = tmp_path / "other"
    shutil.copytree(db, other)
    meta = json.loads((other / TARGET_FILE).read_text())
    meta["target"] = {**meta["target"], "mcpu": "znver4"}
    (other / TARGET_FILE).write_text(json.dumps(meta))
    lookup = find_databases(llvm_target(), 1, extra=[other])
    assert other not in lookup.paths and any(
        "tuned for" in n and "znver4" in n for n in lookup.notes
    )
    info = build_library(
        model, {**llvm_target(), "mcpu": "x86-64"}, tmp_path / "c.so", threads=1, databases=[other]
    )
    assert "tuning_database" not in info and "not this target" in info["tuning_notes"][0]


@pytest.mark.slow
def test_the_tvm_profile_measures_fused_kernels_with_the_tuned_schedules(first, tmp_path):
    from edgesplit.backends.tvm.profile import profile_tvm
    from edgesplit.device.spec import load_device
    from edgesplit.model.load import load_model

    onnx.save(conv_model("matmul"), tmp_path / "a.onnx")
    graph = load_model(tmp_path / "a.onnx")
    big = load_device("host-biglittle").processor("big")  # one thread: the database's tuning target
    entry = profile_tvm(graph, big, big.backend("tvm"), runs=3)
    assert "tuned schedules from" in entry.note and set(entry.nodes) == {"conv", "relu", "mm"}
    # conv and relu are one kernel: its time is shared, the conv (by far the larger) taking most
    assert entry.nodes["conv"].latency_ms > entry.nodes["relu"].latency_ms > 0


def test_fusion_groups_follow_elementwise_chains(tiny_conv):
    from edgesplit.backends.tvm.profile import fusion_groups
    from edgesplit.model.load import load_model

    graph = load_model(tiny_conv)
    groups = [[n.name for n in g] for g in fusion_groups(graph, list(graph.nodes))]
    # relu1 feeds two nodes, so conv2 starts a kernel; add joins conv2's, sig starts its own
    assert groups[0] == ["conv1", "relu1"]
    assert ["conv2", "add"] in groups and ["sig"] in groups


@pytest.mark.slow
def test_a_database_folder_without_target_file_is_not_applied(tmp_path):
    from tvm.s_tir import meta_schedule as ms

    folder = tmp_path / "unknown"
    folder.mkdir()
    ms.database.JSONDatabase(work_dir=str(folder))
    lookup = find_databases(llvm_target(), 1, extra=[folder])
    assert lookup.paths == () or folder not in lookup.paths
    assert any("target is unknown" in n for n in lookup.notes)


@pytest.mark.slow
def test_tune_names_a_processor_without_tvm(tmp_path):
    onnx.save(conv_model("matmul"), tmp_path / "a.onnx")
    r = run_cli("tune", str(tmp_path / "a.onnx"), "-d", "host", "-p", "nope")
    assert r.returncode == 2 and "unknown processor 'nope'" in r.stderr, r.stderr
    r = run_cli("tune", str(tmp_path / "a.onnx"), "-d", "snapdragon-8gen2", "-p", "npu")
    assert r.returncode == 2 and "processor 'npu' has no tvm backend" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.ssh
def test_tuning_over_ssh_measures_on_the_remote_rpc_server(sshd, remote_tmp, tmp_path):  # noqa: F811
    """2 kernels x 2 trials through `edgesplit tune --remote`: the candidates are timed by the RPC
    server the agent started there (its log counts one session per candidate), and nothing is
    left behind."""
    onnx.save(conv_model("matmul"), tmp_path / "a.onnx")
    out = tmp_path / "db"
    env = {**os.environ, "EDGESPLIT_CACHE": str(tmp_path / "cache")}
    r = run_cli(
        "tune",
        str(tmp_path / "a.onnx"),
        "-d",
        "host-biglittle",
        "-p",
        "big",
        "--trials-per-task",
        str(PER_TASK),
        "-o",
        str(out),
        "--builders",
        "1",
        "--population",
        str(POPULATION),
        "-q",
        *sshd.cli_args(remote_tmp),
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert f"measured on {sshd.target} ({2 * PER_TASK} RPC sessions there)" in r.stdout
    assert sorted(records_per_workload(out).values()) == [PER_TASK, PER_TASK]
    runs = json.loads((out / TARGET_FILE).read_text())["runs"]
    assert runs[-1]["measured_on"] == sshd.target and runs[-1]["trials"] == 2 * PER_TASK
    assert runs[-1]["population"] == POPULATION  # --population reached the search's options
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if _is_rpc_server(p, remote_tmp)]


def _is_rpc_server(cmdline: Path, folder: Path) -> bool:
    """An RPC server still running from one of this test's agent folders."""
    try:
        args = cmdline.read_bytes().split(b"\0")
        cwd = os.readlink(cmdline.parent / "cwd")
    except OSError:
        return False
    return b"tvm.exec.rpc_server" in args and cwd.startswith(str(folder))


def test_tune_is_registered():
    r = run_cli("tune", "--help")
    assert r.returncode == 0 and "--trials-per-task" in r.stdout and "--remote" in r.stdout


def test_the_record_of_tuning_runs_survives_a_new_run(tmp_path):
    from edgesplit.backends.tvm.database import read_target_file, write_target_file

    tuning = tuning_target(llvm_target(), 1)
    write_target_file(tmp_path, tuning, runs=[{"model": "a"}])
    write_target_file(tmp_path, tuning)  # what a tuning run does when it starts
    assert read_target_file(tmp_path)["runs"] == [{"model": "a"}]


def test_the_shipped_databases_are_found_for_their_own_target_only():
    """Each ``profiles/tvm/NAME`` is found for the tuning target its target.json names (and for no
    other thread count), and every record points at a workload the folder holds."""
    from edgesplit.backends.tvm.database import WORKLOADS, read_target_file, shipped_root

    folders = [p for p in shipped_root().iterdir() if (p / TARGET_FILE).is_file()]
    assert folders, f"no shipped database under {shipped_root()}"
    for folder in folders:
        tuning = read_target_file(folder)["target"]
        target = {k: v for k, v in tuning.items() if k != "num-cores"}
        assert folder in find_databases(target, tuning["num-cores"]).paths
        assert folder not in find_databases(target, tuning["num-cores"] + 1).paths
        workloads = len((folder / WORKLOADS).read_text().splitlines())
        assert set(records_per_workload(folder)) <= set(range(workloads)), folder


@pytest.mark.slow
def test_a_database_is_parsed_once_until_tuning_writes_to_it(tmp_path):
    """Profiling builds one module per fused group, each applying the databases: they are opened
    once per process, and again only once a folder's files change (a tuning run added records)."""
    from edgesplit.backends.tvm.database import WORKLOADS, open_database, shipped_root

    shipped = next(p for p in shipped_root().iterdir() if (p / TARGET_FILE).is_file())
    folder = tmp_path / "db"
    shutil.copytree(shipped, folder)
    # its first 3 kernels: a database of the shipped kind, parsed in a fraction of the second that
    # all 27 take (the test counts parses, not records)
    workloads = (folder / WORKLOADS).read_text().splitlines(keepends=True)
    (folder / WORKLOADS).write_text("".join(workloads[:3]))
    kept = [
        r for r in (folder / RECORDS).read_text().splitlines(keepends=True) if json.loads(r)[0] < 3
    ]
    (folder / RECORDS).write_text("".join(kept))
    first = open_database([folder])
    assert len(first.get_all_tuning_records()) == len(kept) > 0
    assert open_database([folder]) is first
    assert open_database([folder, shipped]) is not first  # another set of folders: its own union
    records = (folder / RECORDS).read_text().splitlines(keepends=True)
    (folder / RECORDS).write_text("".join(records + records[:1]))  # a tuning run appended a record
    again = open_database([folder])
    assert again is not first and open_database([folder]) is again
    assert len(again.get_all_tuning_records()) == len(first.get_all_tuning_records()) + 1
