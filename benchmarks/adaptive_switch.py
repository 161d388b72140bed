"""Adaptive offload on a throttled device: what switching to local saves when the link drops.

The scenario of
``tests/test_offload_netlab.py::test_adaptive_follows_the_bandwidth_on_a_throttled_device``
(the test checks the behaviour; this script prints the speed figures): a device process in a
cgroup CPU quota runs a bundle of 64 3x3 convs (2.7 GFLOP on a 98 kB tensor) whose second part
may run on ``edgesplit serve`` behind a shaped link (tests/netlab.py). The link runs at FAST
Mbit/s, drops to SLOW, then comes back; the session switches between the server and its local
fallback on its own. Per phase it prints the run count, the modes, the run times, and the
session's own estimate of the link (RTT and bandwidth) beside what the lab sets.

Run (root: network namespaces and cgroups):
  .venv/bin/python benchmarks/adaptive_switch.py [--fast-mbps 100] [--slow-mbps 1] [--quota 25]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from netlab import (  # noqa: E402
    ADAPTIVE_DEVICE,
    CpuQuota,
    NetLab,
    heavy_convs,
    make_bundle,
    serve_command,
    wait_ready,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast-mbps", type=float, default=100)
    ap.add_argument("--slow-mbps", type=float, default=1)
    ap.add_argument("--rtt-ms", type=float, default=10)
    ap.add_argument("--quota", type=int, default=25, help="device CPU quota, percent of one core")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        heavy_convs(d / "heavy.onnx")
        bundle = make_bundle(d / "heavy.onnx", d / "bundle", ["r0"], [False, True])
        with NetLab(args.fast_mbps, args.rtt_ms) as lab, CpuQuota(args.quota) as quota:
            lab.spawn(serve_command(bundle, lab.server_ip, 8000), stderr=subprocess.DEVNULL)
            url = f"http://127.0.0.1:{lab.relay(8000).port}"
            wait_ready(url)
            device = subprocess.Popen(
                quota.wrap(
                    [sys.executable, "-c", ADAPTIVE_DEVICE, str(bundle), url, str(d / "heavy.onnx")]
                ),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            lab._procs.append(device)  # stopped with the lab
            assert json.loads(device.stdout.readline())["ready"]

            def phase(mode: str, max_s: float) -> dict:
                device.stdin.write(f"adaptive:{mode} {max_s}\n")
                device.stdin.flush()
                return json.loads(device.stdout.readline())

            phases = [(f"{args.fast_mbps:g} Mbit/s", phase("remote", 15))]
            lab.set_rate(args.slow_mbps)
            phases.append((f"{args.slow_mbps:g} Mbit/s", phase("local", 20)))
            lab.set_rate(args.fast_mbps)
            phases.append((f"{args.fast_mbps:g} Mbit/s again", phase("remote", 20)))
    print(f"device quota {args.quota}% of a core, RTT {args.rtt_ms:g} ms")
    print(
        f"{'link':<20} {'runs':>4} {'first ms':>9} {'last-3 median ms':>17} {'est. RTT ms':>12} "
        f"{'est. Mbit/s':>12}  modes"
    )
    for name, p in phases:
        ms, st = p["ms"], p["stats"]
        modes = " ".join(m.split(":")[-1] for m in p["modes"])
        rtt, bw = st["rtt_ms"], st["bandwidth_mbps"]
        print(
            f"{name:<20} {len(ms):>4} {ms[0]:>9.1f} {statistics.median(ms[-3:]):>17.1f} "
            f"{rtt or float('nan'):>12.1f} {bw or float('nan'):>12.1f}  {modes}"
        )
    slow = phases[1][1]["ms"]
    print(
        f"after the drop: first run {slow[0]:.0f} ms (on the server), then "
        f"{statistics.median(slow[-3:]):.0f}"
        " "
        "ms "
        f"locally ({slow[0] / statistics.median(slow[-3:]):.1f}x)"
    )


if __name__ == "__main__":
    main()
