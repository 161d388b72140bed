"""Hostile fleet files: each is refused through the real command line with exit code 2 and one
line naming the file and the field, before any model is read; nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli

from edgesplit.fleet.spec import FleetError, load_fleet

pytestmark = pytest.mark.timeout(120)

SERVER = "server: {spec: server-h200, slots: 2}\n"
GROUP = "  - {name: g, model: squeezenet, spec: raspberry-pi5, count: 4, deadline_p95_ms: 50}\n"

# case -> (files: name -> text, the file given, what the one line must hold)
CASES = {
    "unknown spec": (
        {"f.yaml": SERVER + "groups:\n" + GROUP.replace("raspberry-pi5", "nosuch-phone")},
        "f.yaml",
        ["f.yaml: groups.g.spec: unknown device 'nosuch-phone'"],
    ),
    "unknown server spec": (
        {"f.yaml": SERVER.replace("server-h200", "nosuch-gpu") + "groups:\n" + GROUP},
        "f.yaml",
        ["f.yaml: server.spec: unknown device 'nosuch-gpu'"],
    ),
    "a device spec as the server": (
        {"f.yaml": SERVER.replace("server-h200", "raspberry-pi5") + "groups:\n" + GROUP},
        "f.yaml",
        ["f.yaml: server.spec:", "not a server spec"],
    ),
    "negative count": (
        {"f.yaml": SERVER + "groups:\n" + GROUP.replace("count: 4", "count: -3")},
        "f.yaml",
        ["f.yaml: groups.0.count: -3 is less than the minimum of 1"],
    ),
    "zero deadline": (
        {
            "f.yaml": SERVER
            + "groups:\n"
            + GROUP.replace("deadline_p95_ms: 50", "deadline_p95_ms: 0")
        },
        "f.yaml",
        ["f.yaml: groups.0.deadline_p95_ms: 0 is less than or equal to the minimum of 0"],
    ),
    "include cycle": (
        {
            "a.yaml": "include: [b.yaml]\n" + SERVER + "groups:\n" + GROUP,
            "b.yaml": "include: [c.yaml]\n",
            "c.yaml": "include: [a.yaml]\n",
        },
        "a.yaml",
        ["c.yaml: include: a cycle (", "a.yaml -> ", "b.yaml -> ", "c.yaml -> "],
    ),
    "a file that includes itself": (
        {"a.yaml": "include: [a.yaml]\n" + SERVER + "groups:\n" + GROUP},
        "a.yaml",
        ["a.yaml: include: a cycle"],
    ),
    "a missing include": (
        {"a.yaml": "include: [gone.yaml]\n" + SERVER + "groups:\n" + GROUP},
        "a.yaml",
        ["a.yaml: include.0: no fleet file gone.yaml"],
    ),
    "malformed YAML": (
        {"f.yaml": SERVER + "groups: [\n  - {name: g\n"},
        "f.yaml",
        ["f.yaml: line", "not valid YAML"],
    ),
    "unknown keys": (
        {"f.yaml": SERVER + "colour: red\ngroups:\n" + GROUP.replace("count: 4", "count: 4, x: 1")},
        "f.yaml",
        ["f.yaml: (top): Additional properties", "'colour' was unexpected", "groups.0:"],
    ),
    "a link and a band": (
        {
            "f.yaml": SERVER
            + "groups:\n"
            + GROUP.replace("count: 4", "count: 4, link: wifi, band: {bandwidth_mbps: 5}")
        },
        "f.yaml",
        ["f.yaml: groups.0: give a link or a band, not both"],
    ),
    "no server": (
        {"f.yaml": "groups:\n" + GROUP},
        "f.yaml",
        ["f.yaml: server: the fleet needs one server"],
    ),
    "two servers": (
        {"a.yaml": "include: [b.yaml]\n" + SERVER + "groups:\n" + GROUP, "b.yaml": SERVER},
        "a.yaml",
        ["server: the fleet needs one server, found 2"],
    ),
    "a group named twice": (
        {
            "a.yaml": "include: [b.yaml]\n" + SERVER + "groups:\n" + GROUP,
            "b.yaml": "groups:\n" + GROUP,
        },
        "a.yaml",
        ["groups: 'g' is named twice"],
    ),
    "an unknown model": (
        {"f.yaml": SERVER + "groups:\n" + GROUP.replace("squeezenet", "nosuch.onnx")},
        "f.yaml",
        ["f.yaml: groups.g.model: 'nosuch.onnx' is neither a file nor a zoo model"],
    ),
    "an infinite number": (
        {
            "f.yaml": SERVER
            + "groups:\n"
            + GROUP.replace("deadline_p95_ms: 50", "deadline_p95_ms: .inf")
        },
        "f.yaml",
        ["f.yaml: groups.0.deadline_p95_ms"],
    ),
}


def _write(tmp: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (tmp / name).write_text(text)


# Through the real command line (a process each, 0.7-1 s): four cases in the quick subset, the
# rest marked slow; every case is also refused in-process below.
QUICK_CLI = {"unknown spec", "include cycle", "malformed YAML", "negative count"}


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=() if c in QUICK_CLI else pytest.mark.slow) for c in sorted(CASES)],
)
def test_bad_fleet_file_one_line_exit_2(case, tmp_path):
    files, given, wanted = CASES[case]
    _write(tmp_path, files)
    r = run_cli("fleet", "plan", str(tmp_path / given), "-o", str(tmp_path / "out"), "-q")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("edgesplit: error: "), r.stderr
    for w in wanted:
        assert w in lines[0], lines[0]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_fleet_file_refuses_it_in_one_line(case, tmp_path):
    """What the command calls refuses every case with a FleetError of one line (exit code 2) that
    holds what the command prints, and writes nothing."""
    from edgesplit.workflows.fleet import plan_fleet_file

    files, given, wanted = CASES[case]
    _write(tmp_path, files)
    with pytest.raises(FleetError) as e:
        plan_fleet_file(tmp_path / given, tmp_path / "out")
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    for w in wanted:
        assert w in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["include cycle", "negative count", "malformed YAML"])
def test_load_fleet_raises_fleet_error(case, tmp_path):
    files, given, _ = CASES[case]
    _write(tmp_path, files)
    with pytest.raises(FleetError) as e:
        load_fleet(tmp_path / given)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)


def test_a_good_fleet_file_with_includes_reads(tmp_path):
    _write(
        tmp_path,
        {
            "a.yaml": "include: [b.yaml, c.yaml]\n" + SERVER + "groups:\n" + GROUP,
            "b.yaml": "include: [c.yaml]\ngroups:\n" + GROUP.replace("name: g", "name: h"),
            "c.yaml": "groups:\n" + GROUP.replace("name: g", "name: k"),
        },
    )
    fleet = load_fleet(tmp_path / "a.yaml")  # c.yaml twice, no cycle: read once
    assert sorted(g.name for g in fleet.groups) == ["g", "h", "k"]
    assert fleet.server.slots == 2
