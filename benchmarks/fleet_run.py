"""An emulated fleet: five strategies measured against a real batching ``edgesplit serve``.

What is real and what is emulated:

* **Real**: the server (``edgesplit serve --max-batch ... --max-queue-delay-ms ...``, its own
  process in its own network namespace, computing each strategy's server parts with ONNX Runtime
  on this machine's CPU); each device's link (a veth pair per device into the server's namespace,
  rate-limited by ``tc tbf`` in both directions); the bytes sent (the real intermediate tensor of
  the plan's cut, computed once from a random input, as an OIP binary request).
* **Emulated**: the device's own compute (the client sleeps the plan's device time on its spec,
  as the planner's cost model predicts it); the link's propagation delay (this kernel has no
  netem: the client sleeps half the RTT before sending and half after the answer); the device's
  energy (modelled as the planner prices it, :func:`edgesplit.fleet.price.energy_at_mj`: the
  plan's energy alone, which holds its compute, its hand-offs, its radio and its idle power, plus
  the device's idle power over the time the answer took longer than alone, or less where it came
  sooner).

Strategies (all on the same fleet file):

* ``device``: every group on its own device (its cheapest device-only plan);
* ``offload``: the whole model on the server;
* ``alone``: each group's own best plan chosen alone (what Neurosurgeon or DADS pick);
* ``server-load``: each group planned as ``partition --server-load N`` does (N identical devices,
  N the fleet's device count, the server's slots);
* ``fleet``: :func:`edgesplit.fleet.plan_fleet`'s joint plan and its server batching settings.

The emulator runs plans whose server part is one suffix of the model (one server part per
request, the model's outputs returned); candidates of another shape are dropped before planning,
and the run says how many.

Each device sends Poisson arrivals at its group's rate; a device computes one request at a time
(a request waits for the device while the one before it runs on it). Latency is from arrival to
the answer. The server's batch sizes and busy time come from its ``Server-Timing`` (``batch``:
the run that computed each request and its size; ``compute``: the run's time).

The capacity sweep (``--sweep 1,2,4``): every group's count times each scale. At each size the
fleet planner re-plans (``replanned``) and the plan it chose at the first scale runs unchanged
(``fixed``), both on the emulated fleet; it prints a table and writes the runs to ``--json``.

Only offloading devices get a shaped link (device-only plans send nothing); at most 250.

Needs root for ``ip netns`` and ``tc`` (the netlab tests' facilities).

Run: PYTHONPATH=. .venv/bin/python benchmarks/fleet_run.py [benchmarks/fleets/lab.yaml]
     [--duration-s 30] [--strategies device,offload,alone,server-load,fleet] [--json out.json]
     [--sweep 1,2,3,4,6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from netlab import (  # noqa: E402
    free_port,
    serve_command,
    stop_process,
    tbf_commands,
    wait_ready,
)

from edgesplit.fleet.price import Candidate, energy_at_mj  # noqa: E402
from edgesplit.runtime import oip  # noqa: E402

STRATEGIES = ("device", "offload", "alone", "server-load", "fleet")


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=30)


class FleetLab:
    """A server namespace with one veth pair per device, each shaped by ``tc tbf`` both ways."""

    def __init__(self, rates_mbps: list[float]):
        uid = os.getpid() % 1000
        self.ns = f"esfleet{uid}"
        self.rates = rates_mbps
        self.links: list[tuple[str, str]] = []  # (host interface, server ip) per device
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> FleetLab:
        try:
            r = sh("ip", "netns", "add", self.ns, check=False)
            if r.returncode != 0:
                raise SystemExit(f"network namespaces refused: {r.stderr.strip()}")
            sh("ip", "-n", self.ns, "link", "set", "lo", "up")
            for i, mbps in enumerate(self.rates):
                h, p = f"esfh{os.getpid() % 1000}x{i}", f"esfp{os.getpid() % 1000}x{i}"
                host_ip, server_ip = f"10.233.{i}.1", f"10.233.{i}.2"
                sh("ip", "link", "add", h, "type", "veth", "peer", "name", p)
                self.links.append((h, server_ip))
                sh("ip", "link", "set", p, "netns", self.ns)
                sh("ip", "addr", "add", f"{host_ip}/30", "dev", h)
                sh("ip", "link", "set", h, "up")
                sh("ip", "-n", self.ns, "addr", "add", f"{server_ip}/30", "dev", p)
                sh("ip", "-n", self.ns, "link", "set", p, "up")
                for cmd in tbf_commands(h, self.ns, p, mbps):
                    sh(*cmd)
        except BaseException:
            self.close()
            raise
        return self

    def spawn(self, argv: list[str], **popen) -> subprocess.Popen:
        p = subprocess.Popen(["ip", "netns", "exec", self.ns, *argv], **popen)
        self._procs.append(p)
        return p

    def close(self) -> None:
        for p in self._procs:
            stop_process(p)
        for h, _ in self.links:
            sh("ip", "link", "del", h, check=False)
        sh("ip", "netns", "del", self.ns, check=False)

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- plans: the fleet's candidates, restricted to what the emulator runs


@dataclass(frozen=True)
class Emulated:
    """One candidate as the emulator runs it: device compute to sleep, the server part (or none),
    the bytes it sends, and the figures of the energy model."""

    name: str
    key: str | None
    device_compute_ms: float
    compute_mj: float
    cut: tuple[str, ...]  # tensors sent to the server ((): device only)
    alone: Candidate  # the candidate as the planner priced it, alone


def suffix_cut(cm, assign: np.ndarray) -> tuple[str, ...] | None:
    """The tensors a plan sends to the server when its server nodes are one suffix of the model
    (() for a device-only plan); None for any other shape."""
    on = cm.remote[assign]
    if not on.any():
        return ()
    sent = []
    for f in cm.flows:
        src_remote = f.src >= 0 and on[f.src]
        if not src_remote and any(on[d] for d in f.dsts):
            sent.append(f.tensor)
        if src_remote and any(not on[d] for d in f.dsts):
            return None  # the device needs a server tensor: not a suffix
    return tuple(dict.fromkeys(sent))


def emulated(cm, made) -> Emulated | None:
    a = made.assign
    cut = suffix_cut(cm, a)
    if cut is None:
        return None
    dev = ~cm.remote[a]
    rows = np.flatnonzero(dev)
    return Emulated(
        made.candidate.name,
        made.candidate.key,
        float(cm.node_ms[rows, a[rows]].sum()),
        float(cm.node_mj[rows, a[rows]].sum()),
        cut,
        made.candidate,
    )


def plan_strategies(fleet_file: str, work: Path, names: tuple[str, ...]):
    """Each strategy's choice (a candidate per group) and server setting, with the candidates."""
    from edgesplit.fleet import Server, plan_fleet
    from edgesplit.fleet.candidates import Made, price
    from edgesplit.fleet.plan import best_alone
    from edgesplit.fleet.spec import load_fleet
    from edgesplit.optimize.load import ServerLoad
    from edgesplit.optimize.planner import costs_of, solve_plan
    from edgesplit.workflows.fleet import check_specs, fleet_candidates, fleet_group

    fleet = load_fleet(fleet_file)
    check_specs(fleet)
    made = fleet_candidates(fleet, work / "models", {})
    n_devices = sum(g.count for g in fleet.groups)
    per_group, dropped, loaded_assign = {}, 0, {}
    for g in fleet.groups:
        problem, cm, cands = made[g.name]
        cands = list(cands)
        n = cm.n_nodes
        extra = {
            "server-only": np.array(
                [
                    cm.processors.index(p)
                    for p in cm.processors
                    if cm.remote[cm.processors.index(p)]
                ][:1]
                * n
            )
        }
        home = int(cm.home)
        extra["only:home"] = np.full(n, home)
        if "server-load" in names:
            loaded = replace(problem, server_load=ServerLoad(n_devices, fleet.server.slots))
            plan = solve_plan(loaded, max_evals=150)
            idx = {name: i for i, name in enumerate(cm.nodes)}
            procs = {p: i for i, p in enumerate(cm.processors)}
            remote_names = [p for p in cm.processors if cm.remote[procs[p]]]
            a = np.full(n, home)
            for part in plan.parts:
                proc = part.processor
                if proc not in procs:
                    proc = next(r for r in remote_names if r.endswith("." + proc))
                for node in part.nodes:
                    a[idx[node]] = procs[proc]
            extra["server-load"] = a
            loaded_assign[g.name] = a
        for name, a in extra.items():
            if not any(np.array_equal(m.assign, a) for m in cands):
                cands.append(Made(price(problem, costs_of(problem), name, a), a))
        kept = [(m, e) for m in cands if (e := emulated(cm, m)) is not None]
        dropped += len(cands) - len(kept)
        per_group[g.name] = (g, problem, cm, kept)
    groups = [
        fleet_group(g, [m.candidate for m, _ in kept]) for g, _, _, kept in per_group.values()
    ]
    s = fleet.server
    file_server = Server(s.slots, s.max_batch, s.max_queue_delay_ms)
    choices: dict[str, tuple[list[int], Server, dict]] = {}
    for name in names:
        if name == "fleet":
            fc = plan_fleet(groups, file_server, max_replicas=1)
            choices[name] = (list(fc.pricing.choice), fc.server, {"unmet": list(fc.unmet)})
            continue
        pick = []
        for gr, (_, _, _, kept) in zip(groups, per_group.values()):
            names_ = [m.candidate.name for m, _ in kept]
            if name == "device":
                pick.append(best_alone(gr, device_only=True))
            elif name == "offload":
                pick.append(names_.index("server-only") if "server-only" in names_ else 0)
            elif name == "alone":
                pick.append(best_alone(gr))
            else:
                want = next(
                    (
                        i
                        for i, (m, _) in enumerate(kept)
                        if np.array_equal(m.assign, loaded_assign[gr.name])
                    ),
                    None,
                )
                pick.append(best_alone(gr) if want is None else want)
        choices[name] = (pick, file_server, {})
    return fleet, per_group, groups, choices, dropped


# ---- the server bundle: every distinct server part of one strategy, served together


def unique_names(model, prefix: str):
    """``model`` with its inputs and outputs renamed ``PREFIX.NAME`` (through Identity nodes): one
    bundle serves parts of several models, and a tensor name is written by one part only."""
    from onnx import helper

    g = model.graph
    head = []
    for i in g.input:
        head.append(helper.make_node("Identity", [f"{prefix}.{i.name}"], [i.name]))
        i.name = f"{prefix}.{i.name}"
    tail = []
    for o in g.output:
        tail.append(helper.make_node("Identity", [o.name], [f"{prefix}.{o.name}"]))
        o.name = f"{prefix}.{o.name}"
    nodes = [*head, *g.node, *tail]
    del g.node[:]
    g.node.extend(nodes)
    return model


def renamed(t, prefix: str):
    return replace(t, name=f"{prefix}.{t.name}")


def server_bundle(out: Path, parts: dict[str, tuple[str, tuple[str, ...]]]) -> dict[str, dict]:
    """Write a bundle serving ``parts`` (part name -> (model path, cut tensors)); returns, per part,
    a request body, its headers and the input bytes."""
    import onnx
    import onnxruntime as ort
    from onnx import helper, shape_inference, utils

    from edgesplit.bundle.format import (
        Manifest,
        PartArtifact,
        TensorSpec,
        checksums,
        write_manifest,
    )
    from edgesplit.optimize.plan import Part, Plan
    from edgesplit.util import sha256_file

    (out / "parts").mkdir(parents=True, exist_ok=True)
    arts, files, plan_parts, requests = [], [], [], {}
    for name, (model_path, cut) in parts.items():
        model = shape_inference.infer_shapes(onnx.load(model_path))
        infos = {
            v.name: v for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]
        }

        def spec(t: str, infos=infos) -> TensorSpec:
            tt = infos[t].type.tensor_type
            return TensorSpec(
                t,
                tuple(d.dim_value for d in tt.shape.dim),
                helper.tensor_dtype_to_np_dtype(tt.elem_type).name,
            )

        inits = {i.name for i in model.graph.initializer}
        ins = [i.name for i in model.graph.input if i.name not in inits]
        outs = [o.name for o in model.graph.output]
        ex = utils.Extractor(model)
        rel = f"parts/{name}.onnx"
        onnx.save(unique_names(ex.extract_model(list(cut), outs), name), out / rel)
        files.append(rel)
        x = {
            i: np.random.default_rng(0).standard_normal(spec(i).shape).astype(np.float32)
            for i in ins
        }
        if list(cut) == ins:
            mid = x
        else:
            head = out / f"{name}.head.onnx"
            onnx.save(ex.extract_model(ins, list(cut)), head)
            got = ort.InferenceSession(str(head)).run(list(cut), x)
            mid = dict(zip(cut, got))
        chunks, hlen = oip.encode_request({f"{name}.{k}": v for k, v in mid.items()})
        body = b"".join(bytes(c) for c in chunks)
        requests[name] = {
            "body": body,
            "headers": {oip.HEADER_LENGTH: str(hlen), "Content-Type": "application/octet-stream"},
            "out_nbytes": sum(int(np.prod(spec(o).shape)) * 4 for o in outs),
        }
        arts.append(
            PartArtifact(
                name=name,
                processor="cpu",
                backend="ort",
                file=rel,
                onnx_file=rel,
                inputs=tuple(renamed(spec(t), name) for t in cut),
                outputs=tuple(renamed(spec(t), name) for t in outs),
                depends_on=(),
                remote=True,
                fallback=None,
            )
        )
        plan_parts.append(
            Part(
                name=name,
                processor="cpu",
                backend="ort",
                remote=True,
                nodes=(),
                inputs=tuple(f"{name}.{t}" for t in cut),
                outputs=tuple(f"{name}.{t}" for t in outs),
            )
        )
    first = next(iter(parts.values()))[0]
    sha = sha256_file(first)
    plan = Plan(
        model_sha256=sha,
        model_name="fleet",
        model_path=str(first),
        device="fleet",
        server="lab-server",
        objective="manual",
        assignment={},
        parts=tuple(plan_parts),
    )
    write_manifest(
        out,
        Manifest(
            model_sha256=sha,
            model_name="fleet",
            device="fleet",
            inputs=tuple(t for a in arts for t in a.inputs),
            outputs=tuple(t for a in arts for t in a.outputs),
            parts=tuple(arts),
            files=checksums(out, files),
            plan=plan,
            server="lab-server",
        ),
    )
    return requests


# ---- the clients: one asyncio task per device


def _batch(value: str | None) -> tuple[int, int] | None:
    for metric in (value or "").split(","):
        name, *params = (p.strip() for p in metric.split(";"))
        if name == "batch":
            for p in params:
                if p.startswith("desc="):
                    bid, _, size = p[5:].strip('"').partition("x")
                    return int(bid), int(size)
    return None


async def device(
    session,
    url: str,
    plan: Emulated,
    req,
    rate_per_s: float,
    rtt_ms: float,
    until: float,
    warm_until: float,
    rng,
    rows: list,
) -> None:
    """Poisson arrivals; one request at a time on the device; one row per request after warm-up."""
    loop = asyncio.get_running_loop()
    arrival = loop.time() + rng.exponential(1 / rate_per_s)
    while arrival < until:
        if (wait := arrival - loop.time()) > 0:
            await asyncio.sleep(wait)
        start = loop.time()
        await asyncio.sleep(plan.device_compute_ms / 1e3)  # emulated device compute
        row = {"arrival": arrival, "batch": None, "compute_ms": 0.0, "ok": True}
        if plan.cut:
            await asyncio.sleep(rtt_ms / 2e3)  # emulated propagation delay (no netem here)
            try:
                async with session.post(url, data=req["body"], headers=req["headers"]) as r:
                    await r.read()
                    row["ok"] = r.status == 200
                    row["batch"] = _batch(r.headers.get("Server-Timing"))
                    from edgesplit.runtime.client import server_timing

                    row["compute_ms"] = server_timing(r.headers.get("Server-Timing")).get(
                        "compute", 0.0
                    )
            except Exception as e:  # noqa: BLE001 - counted as a failed request
                row["ok"], row["error"] = False, f"{type(e).__name__}: {e}"
            await asyncio.sleep(rtt_ms / 2e3)
        done = loop.time()
        row["latency_ms"] = (done - arrival) * 1e3
        row["busy_ms"] = (done - start) * 1e3
        row["done"] = done
        if arrival >= warm_until:
            rows.append(row)
        arrival += rng.exponential(1 / rate_per_s)


async def drive(fleet, per_group, pick, lab: FleetLab, port: int, requests, duration_s: float):
    import aiohttp

    rows: dict[str, list] = {g.name: [] for g in fleet.groups}
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    warm, until = t0 + 3.0, t0 + 3.0 + duration_s
    tasks, k = [], 0
    sessions = []
    for gi, g in enumerate(fleet.groups):
        _, _, _, kept = per_group[g.name]
        plan = kept[pick[gi]][1]
        rtt = g.rtt_ms if g.rtt_ms is not None else 0.0
        for d in range(g.count):
            ip = ""
            if plan.cut:  # only offloading devices have a link
                _, ip = lab.links[k]
                k += 1
            s = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
            sessions.append(s)
            url = f"http://{ip}:{port}/v2/models/{part_name(plan)}/infer"
            rng = np.random.default_rng(1000 * gi + d)
            tasks.append(
                device(
                    s,
                    url,
                    plan,
                    requests.get(part_name(plan)),
                    g.rate_per_s,
                    rtt,
                    until,
                    warm,
                    rng,
                    rows[g.name],
                )
            )
    await asyncio.gather(*tasks)
    for s in sessions:
        await s.close()
    last = max((r["done"] for rs in rows.values() for r in rs), default=until)
    return rows, max(duration_s, last - warm)


def part_name(plan: Emulated) -> str:
    return "p" + (plan.key or "device").split("/")[-1] if plan.cut else "device"


def energy_mj(plan: Emulated, row) -> float:
    """The device's modelled energy for one request, priced as the planner prices it: the plan's
    energy alone, plus idle power over the time the answer took longer than alone (less where it
    came sooner)."""
    return energy_at_mj(plan.alone, row["busy_ms"])


def run_strategy(name, fleet, per_group, pick, server, work: Path, duration_s: float) -> dict:
    from edgesplit.workflows.fleet import serve_args

    parts = {}
    for gi, g in enumerate(fleet.groups):
        _, problem, cm, kept = per_group[g.name]
        plan = kept[pick[gi]][1]
        if plan.cut:
            parts[part_name(plan)] = (str(problem.graph.path), plan.cut)
    rates = []  # a shaped link per offloading device (device-only devices send nothing)
    for gi, g in enumerate(fleet.groups):
        if per_group[g.name][3][pick[gi]][1].cut:
            rates += [g.bandwidth_mbps] * g.count
    if len(rates) > 250:
        raise SystemExit(f"{len(rates)} offloading devices: the lab's 10.233.N subnets stop at 250")
    out = {"strategy": name, "serve_args": serve_args(server), "groups": {}}
    with FleetLab(rates) as lab:
        requests, proc = {}, None
        if parts:
            bundle = work / f"server-{name}"
            requests = server_bundle(bundle, parts)
            port = free_port()
            args = serve_args(server).split()
            log = open(Path(os.environ.get("FLEETRUN_LOGS", work)) / f"serve-{name}.log", "wb")
            proc = lab.spawn(serve_command(bundle, "0.0.0.0", port, *args), stderr=log)
            wait_ready(f"http://{lab.links[0][1]}:{port}", proc)
        else:
            port = 0
        rows, wall_s = asyncio.run(drive(fleet, per_group, pick, lab, port, requests, duration_s))
    batches: dict[int, tuple[int, float]] = {}
    for gi, g in enumerate(fleet.groups):
        _, _, _, kept = per_group[g.name]
        plan = kept[pick[gi]][1]
        rs = rows[g.name]
        lat = np.array([r["latency_ms"] for r in rs if r["ok"]])
        e = [energy_mj(plan, r) for r in rs if r["ok"]]
        for r in rs:
            if r["batch"]:
                batches[r["batch"][0]] = (r["batch"][1], r["compute_ms"])
        out["groups"][g.name] = {
            "plan": plan.name,
            "server_part": part_name(plan) if plan.cut else None,
            "requests": len(rs),
            "failed": sum(not r["ok"] for r in rs),
            "deadline_p95_ms": g.deadline_p95_ms,
            "met_pct": 100.0 * float((lat <= g.deadline_p95_ms).sum()) / max(1, len(rs)),
            "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
            "p95_ms": float(np.percentile(lat, 95)) if len(lat) else None,
            "device_mj_per_request": float(np.mean(e)) if e else None,
        }
    n = sum(v["requests"] for v in out["groups"].values())
    sizes = [s for s, _ in batches.values()]
    out["requests"] = n
    out["met_pct"] = sum(v["met_pct"] * v["requests"] for v in out["groups"].values()) / max(1, n)
    out["device_mj_per_request"] = sum(
        (v["device_mj_per_request"] or 0) * v["requests"] for v in out["groups"].values()
    ) / max(1, n)
    out["server_requests_per_s"] = sum(sizes) / wall_s
    out["server_utilisation"] = sum(ms for _, ms in batches.values()) / 1e3 / wall_s
    out["mean_batch"] = float(np.mean(sizes)) if sizes else None
    out["server_parts"] = sorted(parts)
    return out


def sweep(fleet_file: str, scales: list[int], duration_s: float, json_out: str | None) -> None:
    """The capacity sweep: every group's count times each scale. At each size the planner re-plans
    the fleet (``replanned``), and the plan it chose at the first scale runs unchanged
    (``fixed``); both run on the emulated fleet. Where the two are the same plan, it runs once."""
    from edgesplit.fleet import Server, plan_fleet
    from edgesplit.fleet.price import FleetTable
    from edgesplit.workflows.fleet import serve_args

    with tempfile.TemporaryDirectory(prefix="fleetcap-") as d:
        work = Path(d)
        fleet, per_group, groups, _, dropped = plan_strategies(fleet_file, work, ("device",))
        s = fleet.server
        file_server = Server(s.slots, s.max_batch, s.max_queue_delay_ms)
        fixed = None
        results = []
        for k in scales:
            sgroups = [replace(g, count=g.count * k) for g in groups]
            sfleet = replace(
                fleet, groups=tuple(replace(g, count=g.count * k) for g in fleet.groups)
            )
            fc = plan_fleet(sgroups, file_server, max_replicas=1)
            if fixed is None:
                fixed = (list(fc.pricing.choice), fc.server)
            runs = {"replanned": (list(fc.pricing.choice), fc.server)}
            runs["fixed"] = fixed
            measured: dict[tuple, dict] = {}
            for variant, (pick, server) in runs.items():
                pricing = fc.pricing
                if variant == "fixed":
                    pricing = FleetTable(sgroups, server).price(pick, server)
                same = (tuple(pick), serve_args(server))
                if same in measured:
                    r = dict(measured[same], variant=variant, same_as="replanned")
                else:
                    r = run_strategy(
                        f"{variant}-x{k}", sfleet, per_group, pick, server, work, duration_s
                    )
                    r["loadavg_1min"] = os.getloadavg()[0]  # the host is shared: how busy it was
                    measured[same] = r
                    r = dict(r, variant=variant)
                r["scale"] = k
                r["devices"] = sum(g.count for g in sfleet.groups)
                r["offloading_groups"] = sum(
                    v["server_part"] is not None for v in r["groups"].values()
                )
                r["plans"] = {g: v["plan"] for g, v in r["groups"].items()}
                r["predicted"] = {
                    "utilisation": pricing.utilisation,
                    "saturated": pricing.saturated,
                    "p95_ms": dict(zip((g.name for g in sgroups), pricing.p95_ms)),
                }
                results.append(r)
                print(
                    json.dumps(
                        {
                            key: r[key]
                            for key in (
                                "scale",
                                "variant",
                                "devices",
                                "plans",
                                "met_pct",
                                "device_mj_per_request",
                                "server_utilisation",
                                "requests",
                            )
                        }
                    ),
                    flush=True,
                )
    print(f"\n{dropped} candidate(s) not a server suffix, dropped\n")
    gnames = [g.name for g in fleet.groups]
    head = (
        "| devices | plan | deadlines met | device mJ/request | server busy (predicted) "
        "| groups offloading | " + " | ".join(f"{g} plan, p95 ms" for g in gnames) + " |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in results:
        cells = [
            f"{r['devices']} (x{r['scale']})",
            r["variant"] + (" (same plan)" if r.get("same_as") else ""),
            f"{r['met_pct']:.1f}%",
            f"{r['device_mj_per_request']:.1f}",
            f"{100 * r['server_utilisation']:.0f}% ({100 * r['predicted']['utilisation']:.0f}%)",
            str(r["offloading_groups"]),
        ]
        for g in gnames:
            v = r["groups"][g]
            p95 = "-" if v["p95_ms"] is None else f"{v['p95_ms']:,.0f}"
            cells.append(f"{v['plan']}, {p95} (dl {v['deadline_p95_ms']:g})")
        print("| " + " | ".join(cells) + " |")
    if json_out:
        Path(json_out).write_text(json.dumps(results, indent=1, sort_keys=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fleet", nargs="?", default=str(Path(__file__).parent / "fleets/lab.yaml"))
    ap.add_argument("--duration-s", type=float, default=30.0)
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--sweep",
        default=None,
        help="a capacity sweep: scales of every group's count, comma-separated (e.g. 1,2,4,6)",
    )
    args = ap.parse_args()
    if args.sweep:
        scales = [int(x) for x in args.sweep.split(",")]
        sweep(args.fleet, scales, args.duration_s, args.json)
        return
    from edgesplit.fleet.price import FleetTable

    names = tuple(args.strategies.split(","))
    with tempfile.TemporaryDirectory(prefix="fleetrun-") as d:
        work = Path(d)
        fleet, per_group, groups, choices, dropped = plan_strategies(args.fleet, work, names)
        print(
            f"{sum(g.count for g in fleet.groups)} devices in {len(fleet.groups)} groups; "
            f"{dropped} candidate(s) not a server suffix, dropped"
        )
        results = []
        for name in names:
            pick, server, extra = choices[name]
            r = run_strategy(name, fleet, per_group, pick, server, work, args.duration_s)
            r.update(extra)
            r["loadavg_1min"] = os.getloadavg()[0]  # the host is shared: how busy it was
            priced = FleetTable(groups, server).price(pick, server)
            r["predicted"] = {
                "utilisation": priced.utilisation,
                "saturated": priced.saturated,
                "batch": priced.batch,
                "p95_ms": dict(zip((g.name for g in groups), priced.p95_ms)),
                "device_mj_per_request": dict(zip((g.name for g in groups), priced.energy_mj)),
            }
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "groups"}), flush=True)
    print()
    gnames = [g.name for g in fleet.groups]
    head = (
        "| strategy | deadlines met | device mJ/request | "
        + " | ".join(f"{g} p50/p95 ms (plan)" for g in gnames)
        + " | server busy | mean batch | serve flags |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in results:
        cells = [
            r["strategy"],
            f"{r['met_pct']:.1f}%",
            f"{r['device_mj_per_request']:.1f}",
        ]
        for g in gnames:
            v = r["groups"][g]
            p50 = "-" if v["p50_ms"] is None else f"{v['p50_ms']:.0f}"
            p95 = "-" if v["p95_ms"] is None else f"{v['p95_ms']:.0f}"
            cells.append(f"{p50}/{p95} (dl {v['deadline_p95_ms']:g}, {v['plan']})")
        mb = "-" if r["mean_batch"] is None else f"{r['mean_batch']:.2f}"
        cells += [f"{100 * r['server_utilisation']:.0f}%", mb, f"`{r['serve_args']}`"]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
