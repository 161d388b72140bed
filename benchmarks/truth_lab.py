"""``plan_truth.py``'s offload lab, its measuring worker, and the calibration between its passes.

The lab is ``offload_sweep.py``'s (``tests/netlab.py``): the device is this CPU on one thread in a
cgroup v1 CPU quota, the server ``edgesplit serve`` in a network namespace behind a veth pair
shaped by ``tc``, with 10 ms of RTT added by a relay. The candidates are measured by
:func:`edgesplit.workflows.verify.measure.measure` in a worker process that runs inside the quota
(:func:`worker`), each remote candidate through its own server in the namespace.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

QUOTA_PCT = 25.0
_ports = itertools.count(8100)


def worker() -> None:
    """Measure jobs read as JSON lines on stdin; one JSON line of results per job on stdout."""
    from edgesplit.workflows.verify.measure import measure

    for line in sys.stdin:
        job = json.loads(line)
        urls = job["urls"]

        def options(name: str, urls=urls):
            return (
                {"remote": {"url": urls[name], "timeout_s": 300, "fallback": False}}
                if name in urls
                else None
            )

        bundles = {n: Path(p) for n, p in job["bundles"].items()}
        try:
            m = measure(
                bundles,
                job["metric"],
                job["budget_s"],
                executor_options=options,
                min_rounds=job["rounds"],
                max_rounds=job["rounds"],
            )
            out = {"rounds_ms": dict(m.rounds_ms), "errors": dict(m.errors), "short": m.short}
        except Exception as e:  # noqa: BLE001 - reported as the group's reason, the run goes on
            out = {"rounds_ms": {}, "errors": {}, "short": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)


def _lab_measurer(lab, proc: subprocess.Popen, args):
    from netlab import serve_command, wait_ready

    def run(bundles, metric, cands) -> dict:
        urls = {}
        for name, bundle in bundles.items():
            if cands[name].remote:
                port = next(_ports)
                lab.spawn(serve_command(bundle, lab.server_ip, port), stderr=subprocess.DEVNULL)
                urls[name] = f"http://127.0.0.1:{lab.relay(port).port}"
                wait_ready(urls[name])
        job = {
            "bundles": {n: str(b) for n, b in bundles.items()},
            "urls": urls,
            "metric": metric,
            "budget_s": args.budget_s,
            "rounds": args.rounds,
        }
        proc.stdin.write(json.dumps(job) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    return run


def _specs(tmp: Path):
    """The lab's device and server specs (offload_sweep's), written once into ``tmp``."""
    from offload_sweep import DEVICE_SPEC, ROOFLINE, SERVER_SPEC

    from edgesplit.device.spec import load_device

    peak, bw, launch = (
        ROOFLINE["peak_gflops"],
        ROOFLINE["mem_bandwidth_gbps"],
        ROOFLINE["launch_overhead_ms"],
    )
    (tmp / "lab-device.yaml").write_text(
        DEVICE_SPEC.format(quota=QUOTA_PCT, peak=peak * QUOTA_PCT / 100, bw=bw, launch=launch)
    )
    for kind, name in (("server", "lab-server.yaml"), ("device", "lab-server-local.yaml")):
        (tmp / name).write_text(
            SERVER_SPEC.format(kind=kind, peak=peak, bw=bw, launch=launch, threads=1)
        )
    return load_device(tmp / "lab-device.yaml"), load_device(tmp / "lab-server.yaml")


def _offload_model(name, args, run_group, model_file, quota, dev, srv, tmp) -> list:
    from netlab import NetLab, stop_process
    from offload_sweep import RTT_MS, profiles

    from edgesplit.device.spec import network_link
    from edgesplit.model.load import load_model

    path, shapes = model_file(name, Path(args.work))
    graph = load_model(path, input_shapes=shapes)
    prof = Path(args.profile_dir) / f"{name}.offload-lab.profile.json"
    if not prof.is_file() and args.label != "plain":
        prof = (
            Path(args.plain_profile_dir) / prof.name
        )  # the lab is not calibrated: the plain profile
    if not prof.is_file():
        profiles(path, tmp, quota).save(prof)  # the device in the quota, the server unthrottled
    proc = subprocess.Popen(
        quota.wrap([sys.executable, str(Path(__file__).with_name("plan_truth.py")), "--worker"]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    rows = []
    try:
        for mbps in (float(b) for b in args.bandwidths.split(",")):
            link = network_link(None, bandwidth_mbps=mbps, rtt_ms=RTT_MS)
            choices = {"profile": prof, "server": srv, "link": link}
            for metric in ("latency", "throughput"):
                with NetLab(mbps, RTT_MS) as lab:
                    measurer = _lab_measurer(lab, proc, args)
                    label = f"lab@{mbps:g}Mbit"
                    rows += run_group(graph, dev, name, metric, choices, args, measurer, label)
    finally:
        proc.stdin.close()
        stop_process(proc)
    return rows


def run_offload(names: list[str], args, run_group, model_file) -> list:
    """Every model in the offload lab at each of ``args.bandwidths``; nothing when the lab cannot
    be set up here (it says why)."""
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from netlab import CpuQuota

    import edgesplit

    tmp = Path(tempfile.mkdtemp(prefix="plan-truth-lab-", dir=args.work))
    dev, srv = _specs(tmp)
    rows = []
    try:
        with CpuQuota(QUOTA_PCT) as quota:
            for name in names:
                try:
                    rows += _offload_model(name, args, run_group, model_file, quota, dev, srv, tmp)
                except (edgesplit.EdgesplitError, SystemExit) as e:
                    print(f"{'lab':<16}{name:<14}failed: {e}", flush=True)
    except BaseException as e:  # pytest.skip from the lab: no namespaces, tc or cgroups here
        if type(e).__name__ != "Skipped":
            raise
        print(f"offload lab unavailable here: {e}", flush=True)
    return rows


def calibrate(args, rows: list) -> bool:
    """``edgesplit refit`` on the bundles of the plain pass (per device and model, all
    together),
    into ``WORK/profiles-calibrated``;
    False (and why) when this edgesplit has no ``calibrate``."""
    cmd = [sys.executable, "-m", "edgesplit", "refit", "--help"]
    if subprocess.run(cmd, capture_output=True).returncode != 0:
        print(
            "\nedgesplit refit is not in this edgesplit: calibrate the plan bundles by hand, "
            "put "
            "the profiles in a folder and run again with --profile-dir DIR --label calibrated"
        )
        return False
    out = Path(args.work) / "profiles-calibrated"
    out.mkdir(parents=True, exist_ok=True)
    pairs = sorted({(r.device, r.model) for r in rows if not r.device.startswith("lab@")})
    for device, model in pairs:
        _calibrate_pair(args, device, model, _bundles_of(rows, device, model), out)
    if any(r.device.startswith("lab@") for r in rows):
        print(
            "the offload lab is not calibrated (its bundles need their servers): its plain profile "
            "is reused"
        )
    return True


def _bundles_of(rows: list, device: str, model: str) -> list[str]:
    """The bundles one calibration fits on together: every plan built for (device, model), and each
    baseline once (the throughput group's baselines are the latency group's again)."""
    out, baselines = [], set()
    for r in rows:
        if (r.device, r.model) != (device, model) or not r.bundle or r.same_as:
            continue
        if r.kind == "baseline":
            if r.name in baselines:
                continue
            baselines.add(r.name)
        out.append(r.bundle)
    return out


def _calibrate_pair(args, device: str, model: str, bundles: list[str], out: Path) -> None:
    """One ``edgesplit refit`` on every bundle of (device, model) together, from the plain
    profile."""
    suffix = "." + "+".join(args.backends.split(",")) if args.backends else ""
    profile = Path(args.profile_dir) / f"{model}.{device}{suffix}.profile.json"
    dest = out / profile.name
    cmd = [
        sys.executable,
        "-m",
        "edgesplit",
        "refit",
        *bundles,
        "-o",
        str(dest),
        "--profile",
        str(profile),
    ]
    cmd += ["--rounds", str(args.calibrate_rounds)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        print(f"calibrate {device} {model}: failed: {r.stderr.strip()[-300:]}", flush=True)
        return
    said = [
        ln.strip() for ln in r.stdout.splitlines() if "within" in ln or "contention fitted" in ln
    ]
    print(f"calibrated {device} {model} on {len(bundles)} bundles: {' | '.join(said)}", flush=True)
