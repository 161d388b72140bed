"""Probe a device for what a spec needs: CPU clusters, memory, GPU/NPU nodes, runtimes, rails.

:func:`probe` returns plain facts (JSON-ready); :mod:`edgesplit.device.draft` turns them into
a draft spec. The probe runs on the device itself (the remote agent calls it), reads files under
a configurable ``root`` (so tests can give it a fake ``/sys``, ``/proc`` and ``/dev``), and needs
only the standard library: a device without onnxruntime still gets probed, and the draft says
what to install.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

_DISTRIBUTIONS = {
    "onnxruntime": (
        "onnxruntime",
        "onnxruntime-gpu",
        "onnxruntime-qnn",
        "onnxruntime-openvino",
        "onnxruntime-directml",
    ),
    "tvm": ("apache-tvm", "tvm"),
}
PROFILE_MODULES = ("numpy", "onnx", "onnxruntime", "onnxslim")

# Arm's MIDR part numbers (implementer 0x41) -> core name, and fp32 FLOPs per cycle per core
# (NEON FMA pipes x 4 lanes x 2). Estimates from Arm's software optimisation guides.
ARM_PARTS: dict[str, tuple[str, int]] = {
    "0xd03": ("Cortex-A53", 8),
    "0xd04": ("Cortex-A35", 8),
    "0xd05": ("Cortex-A55", 8),
    "0xd46": ("Cortex-A510", 8),
    "0xd80": ("Cortex-A520", 8),
    "0xd07": ("Cortex-A57", 16),
    "0xd08": ("Cortex-A72", 16),
    "0xd09": ("Cortex-A73", 16),
    "0xd0a": ("Cortex-A75", 16),
    "0xd0b": ("Cortex-A76", 16),
    "0xd0d": ("Cortex-A77", 16),
    "0xd41": ("Cortex-A78", 16),
    "0xd47": ("Cortex-A710", 16),
    "0xd4d": ("Cortex-A715", 16),
    "0xd81": ("Cortex-A720", 16),
    "0xd44": ("Cortex-X1", 32),
    "0xd48": ("Cortex-X2", 32),
    "0xd4e": ("Cortex-X3", 32),
    "0xd82": ("Cortex-X4", 32),
    "0xd0c": ("Neoverse-N1", 16),
    "0xd40": ("Neoverse-V1", 32),
    "0xd49": ("Neoverse-N2", 16),
    "0xd4f": ("Neoverse-V2", 32),
}
_FLAGS = (
    "avx512f",
    "avx2",
    "fma",
    "avx",
    "sse4_2",
    "asimd",
    "asimddp",
    "asimdhp",
    "i8mm",
    "sve",
    "sve2",
    "neon",
)


def module_versions(names: tuple[str, ...] = (*PROFILE_MODULES, "tvm")) -> dict[str, str | None]:
    """Installed version of each module, or None where it cannot be found (nothing is imported)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        version = None
        if found:
            version = "installed"
            for dist in _DISTRIBUTIONS.get(name, (name,)):
                try:
                    version = importlib.metadata.version(dist)
                    break
                except importlib.metadata.PackageNotFoundError:
                    continue
        out[name] = version
    return out


def _text(p: Path) -> str:
    try:
        return p.read_text(errors="replace").strip().strip("\x00")
    except OSError:
        return ""


def _int(p: Path) -> int | None:
    try:
        return int(_text(p))
    except ValueError:
        return None


def _cpuinfo(root: Path) -> tuple[list[dict[str, str]], dict[str, str]]:
    """Per-processor blocks of /proc/cpuinfo, and the lines outside them (``Hardware`` ...)."""
    blocks: list[dict[str, str]] = []
    extra: dict[str, str] = {}
    cur: dict[str, str] = {}
    for line in _text(root / "proc/cpuinfo").splitlines() + [""]:
        if not line.strip():
            if cur:
                (
                    blocks.append(cur)
                    if "processor" in cur and cur["processor"].isdigit()
                    else extra.update(cur)
                )
            cur = {}
            continue
        k, _, v = line.partition(":")
        cur[k.strip()] = v.strip()
    return blocks, extra


def _cpus(root: Path) -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
    blocks, extra = _cpuinfo(root)
    by_id = {int(b["processor"]): b for b in blocks}
    cpu_dirs = sorted(
        (d for d in (root / "sys/devices/system/cpu").glob("cpu[0-9]*") if d.name[3:].isdigit()),
        key=lambda d: int(d.name[3:]),
    )
    cpus = []
    for d in cpu_dirs:
        khz = _int(d / "cpufreq/cpuinfo_max_freq")
        if khz is not None:
            cpus.append(
                {
                    "id": int(d.name[3:]),
                    "max_khz": khz,
                    "part": by_id.get(int(d.name[3:]), {}).get("CPU part"),
                }
            )
    source = "cpufreq"
    if not cpus:
        source = "cpuinfo"
        for i, b in sorted(by_id.items()):
            mhz = b.get("cpu MHz")
            cpus.append(
                {
                    "id": i,
                    "max_khz": int(float(mhz) * 1000) if mhz else None,
                    "part": b.get("CPU part"),
                }
            )
    if not cpus:
        source = "os.cpu_count"
        cpus = [{"id": i, "max_khz": None, "part": None} for i in range(os.cpu_count() or 1)]
    first = blocks[0] if blocks else {}
    flags = set((first.get("flags") or first.get("Features") or "").split())
    info = {
        "cpu_model": first.get("model name")
        or extra.get("Hardware")
        or first.get("Hardware")
        or "",
        "cpu_flags": sorted(f for f in _FLAGS if f in flags),
    }
    return cpus, source, info


def _memory_kb(root: Path) -> int | None:
    for line in _text(root / "proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def _accelerators(root: Path) -> list[dict[str, Any]]:
    dev = root / "dev"
    found: list[dict[str, Any]] = []
    if (dev / "kgsl-3d0").exists():
        clk = _int(root / "sys/class/kgsl/kgsl-3d0/max_gpuclk")
        found.append(
            {
                "kind": "gpu",
                "vendor": "adreno",
                "node": "/dev/kgsl-3d0",
                "model": _text(root / "sys/class/kgsl/kgsl-3d0/gpu_model") or "Adreno",
                "max_mhz": clk // 1_000_000 if clk else None,
            }
        )
    if (dev / "mali0").exists():
        info = _text(root / "sys/class/misc/mali0/device/gpuinfo")
        found.append(
            {"kind": "gpu", "vendor": "mali", "node": "/dev/mali0", "model": info or "Mali"}
        )
    nvhost = sorted(p.name for p in dev.glob("nvhost-*"))
    if nvhost:
        model = _text(root / "proc/device-tree/model") or "NVIDIA Jetson"
        if any(n in ("nvhost-gpu", "nvhost-ctrl-gpu") for n in nvhost) or (dev / "nvgpu").exists():
            found.append(
                {"kind": "gpu", "vendor": "jetson", "node": "/dev/nvhost-ctrl-gpu", "model": model}
            )
        for n in nvhost:
            if re.fullmatch(r"nvhost-(ctrl-)?nvdla\d", n) and "ctrl" not in n:
                found.append(
                    {"kind": "npu", "vendor": "nvdla", "node": f"/dev/{n}", "model": f"{model} DLA"}
                )
    for node in ("fastrpc-cdsp", "adsprpc-smd"):
        if (dev / node).exists():
            found.append(
                {
                    "kind": "npu",
                    "vendor": "hexagon",
                    "node": f"/dev/{node}",
                    "model": "Qualcomm Hexagon",
                }
            )
            break
    if (dev / "rknpu").exists() or any((root / "sys/class/devfreq").glob("*.npu")):
        found.append(
            {"kind": "npu", "vendor": "rknpu", "node": "/dev/rknpu", "model": "Rockchip NPU"}
        )
    for acc in sorted(dev.glob("accel/accel*")):
        driver = Path(os.path.realpath(root / f"sys/class/accel/{acc.name}/device/driver")).name
        found.append(
            {
                "kind": "npu",
                "vendor": driver or "accel",
                "node": f"/dev/accel/{acc.name}",
                "model": driver,
            }
        )
    if (dev / "apex_0").exists():
        found.append(
            {"kind": "npu", "vendor": "edgetpu", "node": "/dev/apex_0", "model": "Coral Edge TPU"}
        )
    found += _nvidia_smi(root)
    return found


def _nvidia_smi(root: Path) -> list[dict[str, Any]]:
    exe = shutil.which("nvidia-smi") if str(root) == "/" else None
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=15,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for i, line in enumerate(out.strip().splitlines()):
        name, _, mem = line.partition(",")
        gpus.append(
            {
                "kind": "gpu",
                "vendor": "nvidia",
                "node": f"/dev/nvidia{i}",
                "model": name.strip(),
                # nvidia-smi gives MiB; a spec's MB are 10^6 bytes
                "memory_mb": round(float(mem) * 2**20 / 1e6)
                if mem.strip().replace(".", "", 1).isdigit()
                else None,
            }
        )
    return gpus


def _ort() -> tuple[list[str] | None, str]:
    if importlib.util.find_spec("onnxruntime") is None:
        return None, "onnxruntime is not installed"
    try:
        import onnxruntime

        return list(onnxruntime.get_available_providers()), ""
    except Exception as e:  # noqa: BLE001 - a broken install: say how
        return None, f"onnxruntime does not import ({type(e).__name__}: {e})"


_X86 = ("x86_64", "amd64", "i386", "i686")
_ARM64 = ("aarch64", "arm64")


def _cpuinfo_arch(root: Path) -> str:
    """The architecture /proc/cpuinfo describes: ``x86``, ``arm`` or ``""`` when it does not say."""
    blocks, extra = _cpuinfo(root)
    keys = set(blocks[0] if blocks else extra)
    if "vendor_id" in keys or "cpu family" in keys:
        return "x86"
    if "CPU implementer" in keys or "Features" in keys:
        return "arm"
    return ""


def emulation(root: str | os.PathLike = "/", machine: str | None = None) -> str:
    """Why this process's timings are not the hardware's, or ``""`` when it runs natively.

    qemu user-mode emulation (how an x86 machine runs an aarch64 root filesystem) reports the
    guest's machine from ``uname`` but passes the host's /proc/cpuinfo through (qemu 7.2, as in
    Debian bookworm); and the kernel runs qemu as the binary's interpreter, which
    /proc/thread-self/exe names (qemu rewrites /proc/self/exe, not thread-self).
    """
    r = Path(root)
    machine = (machine or platform.machine()).lower()
    arch = _cpuinfo_arch(r)
    if (machine in _ARM64 and arch == "x86") or (machine in _X86 and arch == "arm"):
        what = "an x86" if arch == "x86" else "an Arm"
        return (
            f"emulated: {machine} code on {what} CPU (/proc/cpuinfo); timings are not the device's"
        )
    if str(root) == "/":
        try:
            exe = os.readlink("/proc/thread-self/exe")
        except OSError:
            exe = ""
        if "qemu" in os.path.basename(exe):
            return f"emulated: {machine} code run by {exe}; timings are not the device's"
    return ""


def probe(root: str | os.PathLike = "/") -> dict[str, Any]:
    """Facts about the machine this runs on, files read under ``root``."""
    from edgesplit.profile.power import find_rails

    r = Path(root)
    live = str(root) == "/"
    cpus, source, info = _cpus(r)
    usable = sorted(os.sched_getaffinity(0)) if live and hasattr(os, "sched_getaffinity") else None
    providers, ort_error = _ort()
    rails = find_rails(r)
    return {
        "hostname": platform.node() if live else "",
        "system": platform.system(),
        "machine": platform.machine(),
        "emulated": emulation(r) if live else "",
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "android": (r / "system/build.prop").exists() or "ANDROID_ROOT" in os.environ and live,
        "termux": "com.termux" in (os.environ.get("PREFIX", "") if live else "")
        or "com.termux" in sys.executable,
        "cpus": cpus,
        "cpu_source": source,
        "usable_cpus": usable,
        **info,
        "memory_kb": _memory_kb(r),
        "accelerators": _accelerators(r),
        "modules": module_versions(),
        "ort_providers": providers,
        "ort_error": ort_error,
        "power": {
            "source": rails.source,
            "rails": [x.name for x in rails.rails],
            "skipped": list(rails.skipped),
        },
    }
