"""Device discovery: CPU clusters, memory, GPU/NPU nodes from a fake tree, and over a real sshd."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_cli
from sshd import remote_tmp, sshd  # noqa: F401 - fixtures

from edgesplit.device.detect import probe
from edgesplit.device.draft import draft_spec, install_hint, to_yaml
from edgesplit.device.spec import load_device, validate

BARE_PYTHON = Path("/usr/bin/python3")


def put(root: Path, rel: str, value="") -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f"{value}\n")


def phone_tree(root: Path) -> None:
    """A Snapdragon-like 1+3+4 layout: X3 prime, A715 big, A510 little; Adreno GPU; Hexagon NPU."""
    layout = [(3_200_000, "0xd4e")] + [(2_800_000, "0xd4d")] * 3 + [(2_000_000, "0xd46")] * 4
    blocks = []
    for i, (khz, part) in enumerate(layout):
        put(root, f"sys/devices/system/cpu/cpu{i}/cpufreq/cpuinfo_max_freq", khz)
        blocks.append(
            f"processor\t: {i}\nFeatures\t: fp asimd asimddp i8mm\nCPU implementer\t: 0x41\n"
            f"CPU part\t: {part}\n"
        )
    put(root, "proc/cpuinfo", "\n".join(blocks) + "\nHardware\t: Qualcomm Technologies, Inc SM8550")
    put(root, "proc/meminfo", "MemTotal:       11534336 kB\nMemFree:         1000 kB")
    put(root, "dev/kgsl-3d0")
    put(root, "sys/class/kgsl/kgsl-3d0/gpu_model", "Adreno740v2")
    put(root, "sys/class/kgsl/kgsl-3d0/max_gpuclk", 680_000_000)
    put(root, "dev/fastrpc-cdsp")


def test_big_little_phone_becomes_three_clusters_a_gpu_and_an_npu(tmp_path):
    phone_tree(tmp_path)
    facts = probe(tmp_path)
    assert facts["cpu_source"] == "cpufreq" and len(facts["cpus"]) == 8
    facts["usable_cpus"] = None  # this machine's affinity says nothing about the fake phone
    facts["machine"] = "aarch64"
    draft = draft_spec(facts, "my-phone")
    text = to_yaml(draft)
    data = yaml.safe_load(text)
    validate(data, "my-phone.yaml")
    procs = data["processors"]
    assert list(procs) == ["cpu_prime", "cpu_big", "cpu_little", "gpu", "npu"]
    assert procs["cpu_prime"]["cores"] == [0] and procs["cpu_big"]["cores"] == [1, 2, 3]
    assert procs["cpu_little"]["cores"] == [4, 5, 6, 7]
    # X3 at 3.2 GHz: 32 FLOPs/cycle; A510 at 2.0 GHz x 4 cores: 8 FLOPs/cycle
    assert procs["cpu_prime"]["peak_gflops"] == pytest.approx(102.4)
    assert procs["cpu_little"]["peak_gflops"] == pytest.approx(64.0)
    assert procs["gpu"]["backends"][0]["provider"] == "QNNExecutionProvider"
    assert procs["npu"]["backends"][0]["options"]["backend_path"] == "libQnnHtp.so"
    assert data["memory_mb"] == 11811  # 11,534,336 kB (KiB) in 10^6 bytes
    assert "# Estimate: 1 core x 3.20 GHz x 32; Cortex-X3" in text
    assert "Adreno740v2 (/dev/kgsl-3d0)" in text and "Estimate" in text.split("gpu:")[1]
    out = tmp_path / "my-phone.yaml"
    out.write_text(text)
    clusters = ("cpu_prime", "cpu_big", "cpu_little")
    assert load_device(out).processor_names == (
        *clusters,
        "gpu",
        "npu",
        "+".join(clusters),
    )  # a core group


def test_without_cpufreq_one_cluster_from_proc_cpuinfo(tmp_path):
    put(
        tmp_path,
        "proc/cpuinfo",
        "\n".join(
            f"processor\t: {i}\nmodel name\t: Some CPU\ncpu MHz\t\t: 2400.000\nflags\t\t: sse4_2 "
            "avx avx2 fma\n"
            for i in range(4)
        ),
    )
    facts = probe(tmp_path)
    facts["usable_cpus"], facts["machine"] = None, "x86_64"
    data = yaml.safe_load(to_yaml(draft_spec(facts, "box")))
    assert list(data["processors"]) == ["cpu"]
    cpu = data["processors"]["cpu"]
    assert cpu["cores"] == [0, 1, 2, 3] and cpu["peak_gflops"] == pytest.approx(4 * 2.4 * 32)


def test_jetson_nodes_and_missing_onnxruntime(tmp_path):
    put(tmp_path, "sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", 1_500_000)
    put(tmp_path, "proc/device-tree/model", "NVIDIA Jetson Orin Nano Developer Kit")
    for node in ("nvhost-ctrl-gpu", "nvhost-gpu", "nvhost-nvdla0", "nvhost-ctrl-nvdla0"):
        put(tmp_path, f"dev/{node}")
    facts = probe(tmp_path)
    facts.update(
        usable_cpus=None,
        machine="aarch64",
        ort_providers=None,
        ort_error="onnxruntime is not installed",
        modules={**facts["modules"], "onnxruntime": None},
    )
    draft = draft_spec(facts, "orin")
    data = yaml.safe_load(to_yaml(draft))
    assert data["processors"]["gpu"]["backends"][0]["provider"] == "CUDAExecutionProvider"
    assert data["processors"]["npu"]["backends"][0]["options"] == {"trt_dla_enable": "1"}
    header = " ".join(draft.header)
    assert "onnxruntime is missing there" in header and "-m pip install onnxruntime==" in header
    assert "Termux" in install_hint({**facts, "termux": True})


def test_detect_this_machine_through_the_cli(tmp_path):
    out = tmp_path / "here.yaml"
    r = run_cli("devices", "detect", "-o", str(out))
    assert r.returncode == 0, r.stderr
    spec = load_device(out)
    assert spec.name == "here" and spec.processors[0].kind == "cpu"
    assert f"wrote {out}" in r.stdout


@pytest.mark.ssh
def test_detect_over_ssh_drafts_a_valid_spec(sshd, remote_tmp, tmp_path):  # noqa: F811
    out = tmp_path / "remote-box.yaml"
    r = run_cli("devices", "detect", *sshd.cli_args(remote_tmp), "-o", str(out))
    assert r.returncode == 0, r.stderr
    spec = load_device(out)
    assert spec.name == "remote-box" and "cpu" in spec.processor_names
    text = out.read_text()
    assert f"on {sshd.target}" in text and f"Python {sys.version.split()[0]}" in text
    assert [b.provider for b in spec.processor("cpu").backends if b.runtime == "ort"] == [
        "CPUExecutionProvider"
    ]


@pytest.mark.ssh
@pytest.mark.skipif(
    not BARE_PYTHON.exists(), reason="no /usr/bin/python3 to stand for a bare device"
)
def test_detect_on_a_device_without_onnxruntime_says_what_to_install(sshd, remote_tmp, tmp_path):  # noqa: F811
    args = sshd.cli_args(remote_tmp)
    args[args.index("--remote-python") + 1] = str(BARE_PYTHON)
    r = run_cli("devices", "detect", *args)
    assert r.returncode == 0, r.stderr
    validate(yaml.safe_load(r.stdout), "<stdout>")
    if "onnxruntime MISSING" not in r.stdout:
        pytest.skip(f"{BARE_PYTHON} has onnxruntime")
    assert f"install it: {BARE_PYTHON} -m pip install onnxruntime==" in r.stdout


def test_nvidia_smi_gpus_become_cuda_processors(tmp_path, monkeypatch):
    fake = (
        tmp_path / "bin" / "nvidia-smi"
    )  # stands in for the real tool; its CSV format is the real one
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    facts = probe("/")
    gpus = [a for a in facts["accelerators"] if a["vendor"] == "nvidia"]
    assert gpus == [
        {
            "kind": "gpu",
            "vendor": "nvidia",
            "node": "/dev/nvidia0",
            "model": "NVIDIA H200",
            "memory_mb": 150755,  # nvidia-smi's 143,771 MiB in 10^6 bytes
        }
    ]
    data = yaml.safe_load(to_yaml(draft_spec(facts, "gpu-box")))
    gpu = data["processors"]["gpu"]
    assert (
        gpu["backends"] == [{"runtime": "ort", "provider": "CUDAExecutionProvider"}]
        and gpu["memory_mb"] == 150755
    )
