"""Draft a device spec (``devices/NAME.yaml``) from probed facts, with comments on every guess.

CPU cores are grouped by their maximum frequency into clusters (``cpu`` when there is one,
``cpu_big``/``cpu_little``, or ``cpu_prime``/``cpu_big``/``cpu_little``); each GPU or NPU device
node found becomes a processor with the ONNX Runtime execution provider that drives it. What the
probe cannot measure (peak FLOPs, bandwidth, power) is an estimate, and the YAML says so next to
the figure. The result always passes :func:`edgesplit.device.spec.validate`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgesplit.device.detect import ARM_PARTS

_TVM_EXCLUDE = ["LSTM", "GRU", "RNN", "Loop", "Scan", "If"]

# vendor -> (execution provider, options, peak GFLOP/s, GB/s, active W, idle W, what the EP needs)
_ACCEL: dict[str, tuple[str, dict[str, str], float, float, float, float, str]] = {
    "adreno": (
        "QNNExecutionProvider",
        {"backend_path": "libQnnGpu.so"},
        1000,
        30,
        3.0,
        0.1,
        "onnxruntime-qnn (the QNN GPU backend)",
    ),
    "mali": (
        "NnapiExecutionProvider",
        {},
        500,
        20,
        2.5,
        0.1,
        "an onnxruntime build with NNAPI (Android) or ACL",
    ),
    "jetson": (
        "CUDAExecutionProvider",
        {},
        1000,
        60,
        10.0,
        1.0,
        "onnxruntime-gpu built for JetPack (NVIDIA's wheel)",
    ),
    "nvdla": (
        "TensorrtExecutionProvider",
        {"trt_dla_enable": "1"},
        2000,
        60,
        2.0,
        0.1,
        "onnxruntime-gpu with TensorRT (JetPack)",
    ),
    "nvidia": ("CUDAExecutionProvider", {}, 10000, 500, 200.0, 30.0, "onnxruntime-gpu"),
    "hexagon": (
        "QNNExecutionProvider",
        {"backend_path": "libQnnHtp.so"},
        4000,
        30,
        2.0,
        0.05,
        "onnxruntime-qnn (the QNN HTP backend)",
    ),
    "rknpu": ("RknpuExecutionProvider", {}, 3000, 15, 2.0, 0.1, "an onnxruntime build with RKNPU"),
    "intel_vpu": (
        "OpenVINOExecutionProvider",
        {"device_type": "NPU"},
        5000,
        50,
        5.0,
        0.2,
        "onnxruntime-openvino",
    ),
    "amdxdna": (
        "VitisAIExecutionProvider",
        {},
        5000,
        50,
        5.0,
        0.2,
        "onnxruntime-vitisai (Ryzen AI)",
    ),
}


@dataclass(frozen=True)
class DraftSpec:
    """A spec mapping plus comments: ``comments[dotted.key]`` are lines put above that key."""

    data: Mapping[str, Any]
    comments: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    header: tuple[str, ...] = ()


def _clusters(
    cpus: list[dict[str, Any]], usable: list[int] | None
) -> list[tuple[int | None, list[dict[str, Any]]]]:
    """Cores grouped by max frequency, fastest first."""
    groups: dict[int | None, list[dict[str, Any]]] = {}
    for c in cpus:
        if usable is None or c["id"] in usable:
            groups.setdefault(c["max_khz"], []).append(c)
    if not groups:  # affinity excludes everything we saw: trust the files
        return _clusters(cpus, None)
    return sorted(groups.items(), key=lambda kv: -(kv[0] or 0))


def _names(n: int) -> list[str]:
    return {
        1: ["cpu"],
        2: ["cpu_big", "cpu_little"],
        3: ["cpu_prime", "cpu_big", "cpu_little"],
    }.get(n, [f"cpu_c{i}" for i in range(n)])


def _core_flops(facts: Mapping[str, Any], part: str | None, slowest: bool) -> tuple[int, str]:
    if part in ARM_PARTS:
        name, fpc = ARM_PARTS[part]
        return fpc, f"{name}: {fpc} fp32 FLOPs/cycle (NEON FMA pipes x 4 lanes x 2)"
    flags = set(facts.get("cpu_flags", []))
    if "avx512f" in flags:
        return 64, "AVX-512 with FMA: 64 fp32 FLOPs/cycle (2 x 16 lanes x 2)"
    if "avx2" in flags and "fma" in flags:
        return 32, "AVX2 with FMA: 32 fp32 FLOPs/cycle (2 x 8 lanes x 2)"
    if str(facts.get("machine", "")).startswith(("aarch64", "arm64")):
        fpc = 8 if slowest else 16
        return fpc, f"unknown Arm core: assumed {fpc} fp32 FLOPs/cycle"
    return 8, "assumed 8 fp32 FLOPs/cycle (SSE)"


def _cpu_processor(
    facts: Mapping[str, Any],
    key: str,
    khz: int | None,
    cores: list[dict[str, Any]],
    slowest: bool,
    comments: dict[str, tuple[str, ...]],
) -> dict[str, Any]:
    arm = str(facts.get("machine", "")).startswith(("aarch64", "arm64"))
    part = cores[0].get("part")
    fpc, why = _core_flops(facts, part, slowest)
    ghz = (khz or 2_000_000) / 1e6
    ids = sorted(c["id"] for c in cores)
    peak = round(len(ids) * ghz * fpc, 1)
    core_w = (0.3 if fpc <= 8 else 1.0 if fpc <= 16 else 2.0) if arm else 5.0
    p = f"processors.{key}"
    desc = (
        ARM_PARTS[part][0]
        if part in ARM_PARTS
        else (facts.get("cpu_model") or facts.get("machine", "cpu"))
    )
    clock = f"{ghz:.2f} GHz" + ("" if khz else " (clock unknown: assumed)")
    comments[p] = (f"{len(ids)} x {desc} at {clock}, cores {ids} (from {facts.get('cpu_source')})",)
    n = f"{len(ids)} core" + ("s" if len(ids) > 1 else "")
    comments[f"{p}.peak_gflops"] = (f"Estimate: {n} x {ghz:.2f} GHz x {fpc}; {why}.",)
    comments[f"{p}.mem_bandwidth_gbps"] = (
        "Estimate: not measured; a typical "
        + ("LPDDR share for a mobile cluster." if arm else "DDR share.")
        + " Replace with a STREAM-like measurement.",
    )
    comments[f"{p}.active_w"] = (
        f"Estimate: ~{core_w:g} W per active core; replace with a power-rail measurement.",
    )
    idle_share = 10 if arm else 3
    comments[f"{p}.idle_w"] = (
        f"Estimate: 1/{idle_share} of active power"
        + (" (mobile cores power-collapse when idle)." if arm else "."),
    )
    return {
        "kind": "cpu",
        "description": f"{len(ids)} x {desc}",
        "cores": ids,
        "threads": len(ids),
        "peak_gflops": peak,
        "mem_bandwidth_gbps": (15 if slowest and arm else 25) if arm else 20,
        "launch_overhead_ms": 0.005,
        "active_w": round(core_w * len(ids), 2),
        "idle_w": round(core_w * len(ids) / idle_share, 3),
        "backends": [],
    }


def _llvm_target(facts: Mapping[str, Any], part: str | None) -> dict[str, Any]:
    machine = str(facts.get("machine", ""))
    if machine.startswith(("aarch64", "arm64")):
        t: dict[str, Any] = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}
        if "asimddp" in facts.get("cpu_flags", []):
            t["mattr"] = ["+neon", "+dotprod"]
        return t
    flags = set(facts.get("cpu_flags", []))
    return {
        "kind": "llvm",
        "mcpu": "skylake-avx512"
        if "avx512f" in flags
        else "haswell"
        if "avx2" in flags
        else "x86-64",
    }


def draft_spec(facts: Mapping[str, Any], name: str | None = None) -> DraftSpec:
    """A spec for the probed device; every figure that is not measured carries an estimate note."""
    name = (
        re.sub(r"[^A-Za-z0-9_.-]+", "-", name or facts.get("hostname") or "device").strip("-")
        or "device"
    )
    providers = facts.get("ort_providers")
    has_tvm = bool((facts.get("modules") or {}).get("tvm"))
    comments: dict[str, tuple[str, ...]] = {}
    procs: dict[str, Any] = {}
    clusters = _clusters(list(facts.get("cpus") or []), facts.get("usable_cpus"))
    for i, (key, (khz, cores)) in enumerate(zip(_names(len(clusters)), clusters)):
        proc = _cpu_processor(
            facts, key, khz, cores, i == len(clusters) - 1 and len(clusters) > 1, comments
        )
        proc["backends"].append({"runtime": "ort", "provider": "CPUExecutionProvider"})
        if has_tvm:
            proc["backends"].append(
                {
                    "runtime": "tvm",
                    "target": _llvm_target(facts, cores[0].get("part")),
                    "ops": {"exclude": _TVM_EXCLUDE},
                }
            )
        procs[key] = proc
    seen: dict[str, int] = {}
    for acc in facts.get("accelerators") or []:
        if acc["vendor"] not in _ACCEL:
            comments.setdefault("processors", ())
            comments["processors"] += (
                f"{acc['model']} at {acc['node']}: no ONNX Runtime execution provider drives it; "
                "left out.",
            )
            continue
        ep, options, gflops, gbps, active, idle, needs = _ACCEL[acc["vendor"]]
        kind = acc["kind"]
        seen[kind] = seen.get(kind, 0) + 1
        key = kind if seen[kind] == 1 else f"{kind}{seen[kind] - 1}"
        backend: dict[str, Any] = {"runtime": "ort", "provider": ep}
        if options:
            backend["options"] = dict(options)
        here = providers is not None and ep in providers
        p = f"processors.{key}"
        comments[p] = (
            f"{acc['model']} ({acc['node']}).",
            f"{ep} is {'available' if here else 'NOT available'} in the onnxruntime there"
            + ("." if here else f"; it needs {needs}."),
        )
        comments[f"{p}.peak_gflops"] = (
            f"Estimate: typical of a {acc['vendor']} {kind}; replace with a datasheet figure.",
        )
        comments[f"{p}.active_w"] = ("Estimate: replace with a power-rail measurement.",)
        procs[key] = {
            "kind": kind,
            "description": str(acc["model"]),
            "peak_gflops": gflops,
            "mem_bandwidth_gbps": gbps,
            "launch_overhead_ms": 0.05,
            "active_w": active,
            "idle_w": idle,
            "backends": [backend],
        }
        if acc.get("memory_mb"):
            procs[key]["memory_mb"] = acc["memory_mb"]
    data: dict[str, Any] = {
        "name": name,
        "kind": "device",
        "description": f"{facts.get('hostname') or name}: {facts.get('machine')}, "
        f"Python {facts.get('python')}, drafted by edgesplit devices detect",
    }
    if facts.get("memory_kb"):
        data["memory_mb"] = round(facts["memory_kb"] * 1024 / 1e6)  # kB are KiB; MB are 10^6 bytes
        comments["memory_mb"] = ("MemTotal from /proc/meminfo, in 10^6 bytes.",)
    data["processors"] = procs
    return DraftSpec(data, comments, _header(facts))


def _header(facts: Mapping[str, Any]) -> tuple[str, ...]:
    mods = facts.get("modules") or {}
    lines = [
        "Drafted by `edgesplit devices detect` on "
        f"{facts.get('ssh_target') or facts.get('hostname')}: "
        f"{facts.get('system')} {facts.get('machine')}, Python {facts.get('python')} "
        f"({facts.get('python_executable')}).",
        "Runtimes there: " + ", ".join(f"{k} {v or 'MISSING'}" for k, v in mods.items()) + ".",
        "ONNX Runtime execution providers there: "
        f"{', '.join(facts.get('ort_providers') or []) or 'none'}.",
    ]
    if mods.get("onnxruntime") is None or facts.get("ort_providers") is None:
        lines.append(
            f"onnxruntime is missing there ({facts.get('ort_error') or 'not installed'}); install "
            "it: " + install_hint(facts)
        )
    power = facts.get("power") or {}
    lines.append(
        f"Power rails: {power.get('source')} ({', '.join(power.get('rails', []))}): profiles there "
        "measure "
        "energy."
        if power.get("source")
        else "Power rails: none readable, so profiles there model energy from active_w below."
    )
    lines.append("Figures marked 'Estimate' are not measured: check them before trusting a plan.")
    return tuple(lines)


def install_hint(facts: Mapping[str, Any], version: str | None = None) -> str:
    """The command that installs onnxruntime on the probed device (or why pip cannot)."""
    if version is None:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version

        try:
            version = dist_version("onnxruntime")
        except PackageNotFoundError:
            version = None
    py = facts.get("python_executable") or "python3"
    cmd = f"{py} -m pip install onnxruntime" + (f"=={version}" if version else "")
    machine = str(facts.get("machine", ""))
    if facts.get("termux") or facts.get("android"):
        return (
            f"PyPI has no onnxruntime wheel for Termux/Android (bionic libc); build it from source "
            "(onnxruntime's build.sh --android) or use a glibc userland (proot-distro install "
            "debian), "
            f"where `{cmd}` works on {machine}"
        )
    if machine.startswith(("armv7", "armv6", "arm")) and not machine.startswith("arm64"):
        return f"PyPI has no onnxruntime wheel for 32-bit Arm ({machine}); build it from source"
    return cmd


def render(draft: DraftSpec) -> str:
    """YAML text: block mappings for the structure, JSON flow style for values, comments above
    keys."""
    lines = [f"# {h}" for h in draft.header]
    _emit_mapping(lines, draft.data, "", 0, draft.comments)
    return "\n".join(lines) + "\n"


def _emit_mapping(
    lines: list[str],
    data: Mapping[str, Any],
    path: str,
    indent: int,
    comments: Mapping[str, tuple[str, ...]],
) -> None:
    pad = " " * indent
    for key, value in data.items():
        kp = f"{path}.{key}" if path else key
        lines.extend(f"{pad}# {c}" for c in comments.get(kp, ()))
        if isinstance(value, dict) and value and indent < 4:
            lines.append(f"{pad}{key}:")
            _emit_mapping(lines, value, kp, indent + 2, comments)
        elif isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            lines.append(f"{pad}{key}:")
            lines.extend(f"{pad}  - {json.dumps(x)}" for x in value)
        else:
            lines.append(f"{pad}{key}: {json.dumps(value)}")


def to_yaml(draft: DraftSpec, source: str = "<draft>") -> str:
    """The rendered spec, checked: it parses back to the same mapping and passes the schema."""
    import yaml

    from edgesplit.device.spec import validate

    text = render(draft)
    if yaml.safe_load(text) != json.loads(json.dumps(draft.data)):
        raise AssertionError("the rendered spec does not parse back to the draft")
    validate(yaml.safe_load(text), source)
    return text
