"""Device specs: every shipped spec loads, its figures make sense, and bad specs fail clearly."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pytest
import yaml

from edgesplit.device.spec import (
    BACKENDS,
    DEVICES_DIR,
    DeviceSpec,
    list_specs,
    load_device,
    load_links,
    network_link,
    resolve,
)
from edgesplit.errors import DeviceSpecError, InputError

SPECS = list_specs()
DEVICE_SPECS = [p for p in SPECS if p.stem != "links"]
TVM_UNSUPPORTED = ("LSTM", "GRU", "RNN", "Loop", "Scan", "If")


def _check_figures(spec: DeviceSpec) -> None:
    assert spec.processors, spec.name
    for p in spec.processors:
        where = f"{spec.name}.{p.name}"
        assert p.kind in ("cpu", "gpu", "npu", "dsp"), where
        assert p.backends, f"{where} has no backend"
        assert p.peak_gflops > 0 and p.mem_bandwidth_gbps > 0, where
        assert p.launch_overhead_ms >= 0, where
        assert p.active_w > 0 and 0 <= p.idle_w < p.active_w, where
        assert p.memory_mb is None or p.memory_mb > 0, where
        for b in p.backends:
            assert b.runtime in BACKENDS and b.precision == BACKENDS[b.runtime].precision, where
            if b.runtime == "tvm":
                assert b.target and "kind" in b.target, where
                # TVM's ONNX importer has no converter for recurrent ops or control flow.
                assert not any(b.supports(op) for op in TVM_UNSUPPORTED), where
        # Profiles and plans key a processor's backends by runtime: one of each at most.
        keys = [b.key for b in p.backends]
        assert len(keys) == len(set(keys)), where
    for (a, b), (bandwidth_gbps, latency_ms) in spec.links.items():
        assert {a, b} <= set(spec.processor_names)
        assert bandwidth_gbps > 0 and latency_ms >= 0
    assert spec.default_link[0] > 0 and spec.default_link[1] >= 0


# --- every shipped spec ---------------------------------------------------------------------


def test_the_expected_specs_ship():
    names = {p.stem for p in SPECS}
    assert {
        "host",
        "links",
        "snapdragon-8gen2",
        "raspberry-pi5",
        "jetson-orin-nano",
        "server-a100",
    } <= names


@pytest.mark.parametrize("path", DEVICE_SPECS, ids=lambda p: p.stem)
def test_every_device_spec_loads_with_sane_figures(path):
    spec = load_device(path)
    assert spec.name == path.stem
    assert spec.kind in ("device", "server")
    assert spec.path == str(path)
    _check_figures(spec)
    for server in spec.servers:
        assert load_device(server).kind == "server"


def test_links_spec_loads():
    presets = load_links(DEVICES_DIR / "links.yaml")
    assert set(presets) >= {"wifi", "lte", "5g", "3g", "cat1"}
    for link in presets.values():
        assert link.up_mbps > 0 and link.down_mbps > 0 and link.rtt_ms >= 0
        assert link.tx_power_w > 0 and link.rx_power_w > 0
    # DADS (INFOCOM 2019) Table I mean uplink rates, as DESIGN.md records them.
    assert {k: presets[k].up_mbps for k in ("cat1", "3g", "lte", "wifi")} == {
        "cat1": 0.13,
        "3g": 1.1,
        "lte": 5.85,
        "wifi": 18.88,
    }


def test_host_is_detected():
    spec = load_device("host")
    assert spec.local
    cpu = spec.processor("cpu")
    assert cpu.kind == "cpu"
    assert cpu.cores and cpu.threads and cpu.threads > 0
    assert cpu.peak_gflops > 1  # replaced by cores x clock x SIMD width
    assert {b.key for b in cpu.backends} >= {"ort", "tvm"}
    _check_figures(spec)


_NUMBER_LINE = re.compile(r"^\s*(- )?[\w-]+:\s*-?[\d.]+\s*(#.*)?$")
_KEY_VALUE_LINE = re.compile(r"^\s*[\w-]+:\s*[^#\s][^#]*$")


@pytest.mark.parametrize("path", [p for p in SPECS if p.stem != "host"], ids=lambda p: p.stem)
def test_every_figure_has_a_source_comment(path):
    """Each number has a comment naming its source or how it was estimated.

    The comment is on the number's line or above the run of ``key: value`` lines it starts
    (one comment may cover a link's bandwidth and latency, or a cluster's cores and threads).
    """
    lines = path.read_text().splitlines()
    bare = []
    for i, line in enumerate(lines):
        if not _NUMBER_LINE.match(line) or "#" in line:
            continue
        j = i - 1
        while j >= 0 and _KEY_VALUE_LINE.match(lines[j]):
            j -= 1
        if j < 0 or not lines[j].strip().startswith("#"):
            bare.append(f"{path.name}:{i + 1}: {line.strip()}")
    assert not bare, "figures without a source comment:\n" + "\n".join(bare)


# --- the real devices -----------------------------------------------------------------------


def test_snapdragon_processors_and_npu_op_support():
    spec = load_device("snapdragon-8gen2")
    kinds = {p.kind for p in spec.processors}
    assert kinds >= {"cpu", "gpu", "npu"}
    assert {"cpu_big", "cpu_little"} <= set(spec.processor_names)
    assert spec.servers == ("server-a100",)

    npu = spec.processor("npu")
    assert npu.supports("Conv")
    assert npu.supports("Conv", ("float32",))
    assert npu.supports("Conv", ("int8",))
    # Shape inputs are int64 constants; Reshape must still be allowed on the NPU.
    assert npu.supports("Reshape", ("float32", "int64"))
    assert not npu.supports("LSTM")
    assert not npu.supports("GRU")
    assert not npu.supports("Conv", ("float64",))
    htp = npu.backend("ort-int8")
    assert htp.provider == "QNNExecutionProvider"
    assert htp.options["backend_path"] == "libQnnHtp.so"

    big = spec.processor("cpu_big")
    assert big.supports("LSTM")  # through ORT's CPU EP ...
    assert not big.backend("tvm").supports("LSTM")  # ... but not through TVM
    assert big.backend("tvm").target["mtriple"] == "aarch64-linux-gnu"
    assert spec.processor("gpu").backend("tvm").target == {"kind": "opencl", "device": "adreno"}
    # On-chip links are listed for the NPU and symmetric.
    assert ("cpu_big", "npu") in spec.links
    assert spec.onchip_link("npu", "cpu_big") == spec.onchip_link("cpu_big", "npu")


def test_device_with_its_server():
    spec = load_device("snapdragon-8gen2")
    both = spec.with_server(load_device(spec.servers[0]))
    gpu = both.processor("server-a100.gpu")
    assert gpu.is_remote and gpu.server == "server-a100"
    assert gpu.backend("ort").provider == "CUDAExecutionProvider"
    assert gpu.backend("tvm").target == {"kind": "cuda", "arch": "sm_80"}


def test_jetson_has_cuda_gpu_and_no_dla():
    spec = load_device("jetson-orin-nano")
    assert {p.kind for p in spec.processors} == {"cpu", "gpu"}  # the Orin Nano has no DLA
    gpu = spec.processor("gpu")
    assert gpu.backend("ort").provider in ("CUDAExecutionProvider", "TensorrtExecutionProvider")
    assert gpu.backend("tvm").target == {"kind": "cuda", "arch": "sm_87"}


def test_raspberry_pi5_is_cpu_only():
    spec = load_device("raspberry-pi5")
    assert spec.processor_names == ("cpu",)
    assert spec.processor("cpu").cores == (0, 1, 2, 3)


# --- network links --------------------------------------------------------------------------


def test_network_link_preset_and_overrides():
    lte = network_link("lte")
    assert lte == load_links()["lte"]
    slow = network_link("lte", bandwidth_mbps=2.5)
    assert slow.up_mbps == slow.down_mbps == 2.5
    assert slow.rtt_ms == lte.rtt_ms and slow.tx_power_w == lte.tx_power_w
    assert slow.name != lte.name
    far = network_link("lte", rtt_ms=200)
    assert far.rtt_ms == 200 and far.up_mbps == lte.up_mbps
    both = network_link("5g", bandwidth_mbps=50, rtt_ms=0)
    assert (both.up_mbps, both.rtt_ms) == (50, 0)
    # Flags alone: Wi-Fi's radio power with the given rate.
    flags = network_link(None, bandwidth_mbps=10)
    assert flags.up_mbps == 10 and flags.tx_power_w == load_links()["wifi"].tx_power_w


def test_network_link_errors():
    with pytest.raises(DeviceSpecError, match=r"unknown link 'carrier-pigeon'.*lte"):
        network_link("carrier-pigeon")
    with pytest.raises(DeviceSpecError, match="bandwidth"):
        network_link("lte", bandwidth_mbps=0)
    with pytest.raises(DeviceSpecError, match="rtt"):
        network_link("lte", rtt_ms=-1)


# --- malformed specs ------------------------------------------------------------------------

VALID = {
    "name": "toy",
    "kind": "device",
    "processors": {
        "cpu": {
            "kind": "cpu",
            "peak_gflops": 10,
            "mem_bandwidth_gbps": 5,
            "active_w": 2,
            "idle_w": 0.5,
            "backends": [{"runtime": "ort"}, {"runtime": "tvm", "target": {"kind": "llvm"}}],
        },
        "gpu": {
            "kind": "gpu",
            "peak_gflops": 100,
            "mem_bandwidth_gbps": 20,
            "active_w": 3,
            "idle_w": 0.1,
            "backends": [{"runtime": "ort", "provider": "CUDAExecutionProvider"}],
        },
    },
    "links": [{"between": ["cpu", "gpu"], "bandwidth_gbps": 10, "latency_ms": 0.05}],
}


def _write(tmp_path: Path, data, name: str = "toy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def _spec(**changes):
    data = copy.deepcopy(VALID)
    data.update(changes)
    return data


def test_valid_toy_spec_loads(tmp_path):
    spec = load_device(_write(tmp_path, VALID))
    assert spec.processor_names == ("cpu", "gpu")
    assert spec.onchip_link("gpu", "cpu") == (10.0, 0.05)


def _missing_processors():
    data = _spec()
    del data["processors"]
    return data


def _negative_peak():
    data = _spec()
    data["processors"]["cpu"]["peak_gflops"] = -3
    return data


def _processor_extra_key():
    data = _spec()
    data["processors"]["gpu"]["clock_ghz"] = 1.2
    return data


def _tvm_without_target():
    data = _spec()
    del data["processors"]["cpu"]["backends"][1]["target"]
    return data


def _no_backends():
    data = _spec()
    data["processors"]["gpu"]["backends"] = []
    return data


BAD_SPECS = {
    "invalid yaml": ("name: toy\nkind: [device\nprocessors: {}\n", ["not valid YAML", "line"]),
    "top level list": ("- name: toy\n- kind: device\n", ["expected a mapping", "list"]),
    "empty file": ("", ["expected a mapping"]),
    "missing processors": (_missing_processors(), ["processors"]),
    "negative peak_gflops": (_negative_peak(), ["processors.cpu.peak_gflops"]),
    "unknown kind": (_spec(kind="phone"), ["kind", "phone"]),
    "unknown top-level key": (_spec(colour="red"), ["colour"]),
    "unknown processor key": (_processor_extra_key(), ["processors.gpu", "clock_ghz"]),
    "link to unknown processor": (
        _spec(links=[{"between": ["cpu", "tpu"], "bandwidth_gbps": 1, "latency_ms": 0}]),
        ["links.0.between", "tpu"],
    ),
    "tvm backend without target": (_tvm_without_target(), ["processors.cpu.backends.1.target"]),
    "processor without backends": (_no_backends(), ["processors.gpu.backends"]),
    "bad name": (_spec(name="my phone"), ["name"]),
}


@pytest.mark.parametrize("case", list(BAD_SPECS))
def test_malformed_spec_names_file_and_key(tmp_path, case):
    data, needles = BAD_SPECS[case]
    path = _write(tmp_path, data)
    with pytest.raises(DeviceSpecError) as info:
        load_device(path)
    msg = str(info.value)
    assert str(path) in msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    assert isinstance(info.value, InputError)  # CLI exit code 2
    assert "\n" not in msg  # one-line errors


def test_every_problem_is_reported_at_once(tmp_path):
    data = _negative_peak()
    data["processors"]["gpu"]["idle_w"] = -1
    data["colour"] = "red"
    with pytest.raises(DeviceSpecError) as info:
        load_device(_write(tmp_path, data))
    msg = str(info.value)
    assert (
        "processors.cpu.peak_gflops" in msg and "processors.gpu.idle_w" in msg and "colour" in msg
    )


def test_binary_file_is_a_spec_error(tmp_path):
    path = tmp_path / "blob.yaml"
    path.write_bytes(b"\xff\xfe\x00\x01 not text")
    with pytest.raises(DeviceSpecError, match="not a text file") as info:
        load_device(path)
    assert str(path) in str(info.value)


def test_unknown_name_lists_known_specs():
    with pytest.raises(DeviceSpecError) as info:
        load_device("no-such-device")
    msg = str(info.value)
    assert "no-such-device" in msg
    for known in ("snapdragon-8gen2", "jetson-orin-nano", "raspberry-pi5", "host"):
        assert known in msg


def test_missing_path(tmp_path):
    path = tmp_path / "nowhere" / "phone.yaml"
    with pytest.raises(DeviceSpecError) as info:
        load_device(path)
    assert str(path) in str(info.value)


def test_links_and_devices_are_not_interchangeable(tmp_path):
    with pytest.raises(DeviceSpecError, match="link preset file"):
        load_device("links")
    with pytest.raises(DeviceSpecError, match="kind"):
        load_links(DEVICES_DIR / "snapdragon-8gen2.yaml")


def test_malformed_link_preset(tmp_path):
    presets = {
        "name": "links",
        "kind": "links",
        "presets": {"wifi": {"up_mbps": 10, "down_mbps": 10, "rtt_ms": 5, "tx_power_w": 1}},
    }
    path = _write(tmp_path, presets, "links.yaml")
    with pytest.raises(DeviceSpecError) as info:
        load_links(path)
    msg = str(info.value)
    assert str(path) in msg and "presets.wifi" in msg and "rx_power_w" in msg
    presets["presets"]["wifi"]["rx_power_w"] = 1
    assert load_links(_write(tmp_path, presets, "links.yaml"))["wifi"].rx_power_w == 1


# --- names and paths ------------------------------------------------------------------------


def test_spec_names_and_paths_resolve(tmp_path, monkeypatch):
    assert resolve("snapdragon-8gen2") == DEVICES_DIR / "snapdragon-8gen2.yaml"
    # --device path/to/file.yaml: a copy outside devices/ loads the same.
    copy_path = tmp_path / "my-phone.yaml"
    shutil.copy(DEVICES_DIR / "snapdragon-8gen2.yaml", copy_path)
    assert resolve(str(copy_path)) == copy_path
    assert (
        load_device(str(copy_path)).processor_names
        == load_device("snapdragon-8gen2").processor_names
    )
    # A relative path with a folder resolves from the working directory.
    monkeypatch.chdir(tmp_path.parent)
    rel = f"{tmp_path.name}/my-phone.yaml"
    assert resolve(rel) == Path(rel)
    assert load_device(rel).name == "snapdragon-8gen2"


def test_extra_spec_folder_by_name(tmp_path, monkeypatch):
    _write(tmp_path, VALID, "toy-board.yaml")
    monkeypatch.setenv("EDGESPLIT_DEVICES", str(tmp_path))
    assert resolve("toy-board") == tmp_path / "toy-board.yaml"
    assert load_device("toy-board").name == "toy"
    assert "toy-board" in {p.stem for p in list_specs()}
