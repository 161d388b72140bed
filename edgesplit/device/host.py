"""Detect this machine's processors, for the ``host`` device spec (``detect: true``)."""

from __future__ import annotations

import copy
import os
import platform
from pathlib import Path
from typing import Any


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the machine's architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def cpu_mhz() -> float:
    for p in (Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"),):
        try:
            return int(p.read_text()) / 1000.0
        except (OSError, ValueError):
            pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1])
    except (OSError, ValueError):
        pass
    return 2000.0


def usable_cores() -> list[int]:
    """The cores this process may run on: its main thread's and the calling thread's (a worker
    pinned to one core of its processor must still see the others, which ORT's threads run on)."""
    try:
        return sorted(os.sched_getaffinity(0) | os.sched_getaffinity(os.getpid()))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def llvm_target() -> dict[str, Any]:
    """A TVM llvm target for this CPU (JSON form, as TVM 0.27 wants)."""
    flags = cpu_flags()
    machine = platform.machine()
    if machine in ("x86_64", "AMD64"):
        mcpu = (
            "skylake-avx512" if "avx512f" in flags else "haswell" if "avx2" in flags else "x86-64"
        )
        return {"kind": "llvm", "mcpu": mcpu}
    if machine in ("aarch64", "arm64"):
        return {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}
    return {"kind": "llvm"}


def flops_per_cycle() -> int:
    """Single-precision FLOPs per cycle per core: FMA width x 2 ports x 2 (multiply-add)."""
    flags = cpu_flags()
    if "avx512f" in flags:
        return 64
    if "avx2" in flags and "fma" in flags:
        return 32
    if platform.machine() in ("aarch64", "arm64"):
        return 16
    return 8


def detect_host(data: dict[str, Any]) -> dict[str, Any]:
    """Fill the spec's processors from this machine.

    The spec's ``processors.cpu`` is a template (power figures, bandwidth); cores, threads,
    peak FLOPs and the backends available here replace what it says. A CUDA GPU is added where
    ONNX Runtime offers the CUDA execution provider.
    """
    import onnxruntime as ort

    data = copy.deepcopy(data)
    procs = data["processors"]
    cores = usable_cores()
    cpu = procs.setdefault(
        "cpu",
        {
            "kind": "cpu",
            "mem_bandwidth_gbps": 20.0,
            "active_w": 15.0,
            "idle_w": 5.0,
            "peak_gflops": 1.0,
            "backends": [],
        },
    )
    cpu["cores"] = cores
    cpu["threads"] = len(cores)
    cpu["peak_gflops"] = round(len(cores) * cpu_mhz() / 1000.0 * flops_per_cycle(), 1)
    cpu["backends"] = [
        {"runtime": "ort", "provider": "CPUExecutionProvider"},
        {
            "runtime": "tvm",
            "target": llvm_target(),
            "ops": {"exclude": ["LSTM", "GRU", "RNN", "Loop", "Scan", "If"]},
        },
    ]
    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" in providers and "gpu" not in procs:
        procs["gpu"] = {
            "kind": "gpu",
            "peak_gflops": 10000.0,
            "mem_bandwidth_gbps": 500.0,
            "active_w": 200.0,
            "idle_w": 30.0,
            "launch_overhead_ms": 0.01,
            "backends": [{"runtime": "ort", "provider": "CUDAExecutionProvider"}],
        }
    try:
        import psutil

        # MB is 10^6 bytes, as the planner counts a part's memory (optimize/costs.py)
        data.setdefault("memory_mb", round(psutil.virtual_memory().total / 1e6))
    except ImportError:
        pass
    return data
