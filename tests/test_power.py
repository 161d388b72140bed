"""Power rails read from a fake sysfs tree (this machine has none): parsing, arithmetic, energy."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import run_cli
from sshd import remote_tmp, sshd  # noqa: F401 - fixtures

from edgesplit.device.spec import load_device
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.profile.power import ENERGY, POWER, PowerSampler, find_rails
from edgesplit.profile.remote import RemoteOptions, profile_remote
from edgesplit.profile.run import ProfileOptions
from edgesplit.profile.ssh import SshOptions
from edgesplit.profile.steps import profile_steps


def put(root: Path, rel: str, value) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f"{value}\n")


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def rapl_tree(root: Path) -> None:
    for zone, name, uj in (
        ("intel-rapl:0", "package-0", 1_000_000),
        ("intel-rapl:1", "package-1", 5_000_000),
        ("intel-rapl:0:0", "core", 7),
    ):
        put(root, f"sys/class/powercap/{zone}/name", name)
        put(root, f"sys/class/powercap/{zone}/energy_uj", uj)
        put(root, f"sys/class/powercap/{zone}/max_energy_range_uj", 10_000_000)


def test_rapl_sums_top_level_zones_and_unwraps_counters(tmp_path):
    rapl_tree(tmp_path)
    rails = find_rails(tmp_path)
    assert rails.source == "rapl" and [r.name for r in rails.rails] == [
        "rapl:package-0",
        "rapl:package-1",
    ]
    assert all(r.kind == ENERGY and r.wrap == 10_000_000 for r in rails.rails)
    clock = Clock()
    s = PowerSampler(rails, clock=clock)
    s.mark()  # t=0: 1 J and 5 J
    clock.t = 2.0
    put(tmp_path, "sys/class/powercap/intel-rapl:0/energy_uj", 7_000_000)  # +6 J in 2 s: 3 W
    put(tmp_path, "sys/class/powercap/intel-rapl:1/energy_uj", 1_000_000)  # wrapped: +6 J: 3 W
    s.mark()
    assert s.mean_power_w(0.0, 2.0) == pytest.approx(6.0)
    assert s.mean_power_w(0.5, 1.5) == pytest.approx(6.0)  # linear between readings
    assert s.mean_power_w(1.0, 1.0) is None


def test_psys_zone_is_used_alone(tmp_path):
    rapl_tree(tmp_path)
    put(tmp_path, "sys/class/powercap/intel-rapl:2/name", "psys")
    put(tmp_path, "sys/class/powercap/intel-rapl:2/energy_uj", 0)
    assert [r.name for r in find_rails(tmp_path).rails] == ["rapl:psys"]


def jetson_tree(root: Path, vdd_in_mv=5000, vdd_in_ma=1000) -> None:
    d = "sys/class/hwmon/hwmon1"
    put(root, f"{d}/name", "ina3221")
    for k, label, mv, ma in (
        (1, "VDD_IN", vdd_in_mv, vdd_in_ma),
        (2, "VDD_CPU_GPU_CV", 5000, 400),
        (3, "VDD_SOC", 5000, 300),
    ):
        put(root, f"{d}/in{k}_label", label)
        put(root, f"{d}/in{k}_input", mv)
        put(root, f"{d}/curr{k}_input", ma)
    put(root, "sys/class/hwmon/hwmon0/name", "cpu_thermal")
    put(root, "sys/class/hwmon/hwmon0/temp1_input", 45000)


def test_jetson_ina3221_reads_only_the_board_input(tmp_path):
    jetson_tree(tmp_path)
    rails = find_rails(tmp_path)
    assert rails.source == "hwmon" and [r.name for r in rails.rails] == ["hwmon:ina3221:VDD_IN"]
    assert rails.rails[0].kind == POWER and rails.rails[0].read() == pytest.approx(5.0)  # 5 V x 1 A


def test_power_readings_are_integrated_over_the_window(tmp_path):
    put(tmp_path, "sys/class/hwmon/hwmon2/name", "some_pmic")
    put(tmp_path, "sys/class/hwmon/hwmon2/power1_input", 2_000_000)  # microwatts
    rails = find_rails(tmp_path)
    assert [r.name for r in rails.rails] == ["hwmon:some_pmic:power1"]
    clock = Clock()
    s = PowerSampler(rails, clock=clock)
    s.mark()
    clock.t = 1.0
    put(tmp_path, "sys/class/hwmon/hwmon2/power1_input", 4_000_000)
    s.mark()
    assert s.mean_power_w(0.0, 1.0) == pytest.approx(3.0)  # trapezoid: 2 W rising to 4 W
    assert s.mean_power_w(0.5, 1.0) == pytest.approx(3.5)
    assert s.mean_power_w(1.0, 3.0) == pytest.approx(4.0)  # held past the last reading


def test_android_battery_and_charging(tmp_path):
    b = "sys/class/power_supply/battery"
    put(tmp_path, f"{b}/current_now", -500_000)  # microamps; discharging shows as negative here
    put(tmp_path, f"{b}/voltage_now", 4_000_000)  # microvolts
    put(tmp_path, f"{b}/status", "Discharging")
    rails = find_rails(tmp_path)
    assert rails.source == "battery" and rails.rails[0].read() == pytest.approx(2.0)
    put(tmp_path, f"{b}/status", "Charging")
    rails = find_rails(tmp_path)
    assert not rails and "charging" in rails.skipped[0]


@pytest.mark.slow
def test_no_rails_in_an_empty_tree_or_on_this_machine(tmp_path):
    assert not find_rails(tmp_path) and find_rails(tmp_path).source == ""
    if not find_rails("/"):  # DESIGN.md: no RAPL or hwmon power counters here
        out = tmp_path / "p.json"
        r = run_cli(
            "profile",
            str(zoo.save("tiny_dag", tmp_path / "t.onnx")),
            "--backend",
            "ort",
            "--runs",
            "2",
            "--warmup",
            "1",
            "-o",
            str(out),
        )
        assert r.returncode == 0, r.stderr
        assert "energy: modelled" in r.stdout and '"energy": "modelled"' in out.read_text()


def test_measured_energy_is_power_times_latency(tmp_path):
    put(tmp_path, "sys/class/hwmon/hwmon0/name", "ina226")
    put(tmp_path, "sys/class/hwmon/hwmon0/power1_input", 5_000_000)  # a steady 5 W
    graph = load_model(zoo.save("tiny_dag", tmp_path / "t.onnx"))
    prof = profile_steps(
        graph,
        load_device("host"),
        ProfileOptions(["ort"], runs=3, warmup=1),
        rails=find_rails(tmp_path),
    )
    assert prof.energy == "measured"
    e = prof.entry("cpu", "ort")
    assert e.energy == "measured" and "energy measured: hwmon mean 5.00 W" in e.note
    for c in e.nodes.values():
        assert c.energy_mj == pytest.approx(5.0 * c.latency_ms, abs=1e-6)


@pytest.mark.ssh
def test_remote_profile_measures_energy_where_the_device_has_rails(sshd, remote_tmp, tmp_path):  # noqa: F811
    root = tmp_path / "fake-sysfs"
    jetson_tree(root, vdd_in_mv=5000, vdd_in_ma=1500)  # 7.5 W on the board input
    model = zoo.save("tiny_dag", tmp_path / "t.onnx")
    opts = SshOptions(
        identity=str(sshd.identity),
        known_hosts=str(sshd.known_hosts),
        remote_python=sys.executable,
        remote_tmpdir=str(remote_tmp),
        remote_env={"EDGESPLIT_SYSFS_ROOT": str(root)},
    )
    prof = profile_remote(
        model,
        sshd.target,
        RemoteOptions(opts),
        output=tmp_path / "p.json",
        options=ProfileOptions(["ort"], runs=3, warmup=1),
    )
    assert prof.energy == "measured"
    for c in prof.entry("cpu", "ort").nodes.values():
        assert c.energy_mj == pytest.approx(7.5 * c.latency_ms, abs=1e-6)
