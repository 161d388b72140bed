"""Prefill offloaded or not, per band: the generate plan against both fixed choices, shaped link.

The lab of ``benchmarks/adaptive_sweep.py`` (tests/netlab.py): ``edgesplit serve --all-parts`` on
the zoo decoder compiled as one part with dynamic lengths, in a network namespace behind a veth
pair shaped by ``tc tbf`` (both ways), 10 ms of RTT from a user-space relay; the device is a worker
process in a cgroup v1 CPU quota (default 25 % of one core), one ORT thread.

In the device process:

1. the phase profile: the decoder's prefill chunks and decode steps measured there
   (:func:`edgesplit.generate.phase_measure.measure_phases`, on the lab device spec), and the
   server's prefill of the P-token prompt measured from there over the link
   (:func:`edgesplit.generate.offload.measure_server_prefill`: the server's own time per request
   and the bytes each way);
2. the plan per band (:func:`edgesplit.generate.phases.choose_per_band`, the link priced at the
   band's rate both ways and the lab's RTT);
3. per band, ``--rounds`` rounds, each running (a) local prefill (the best local candidate's
   chunk), (b) prefill on the server, (c) the plan's choice, ``GAP_S`` apart, the rounds cycling
   through the six orders of the three.
   Each is a whole greedy generation of N tokens after the P-token prompt: time to first token +
   N - 1 decode steps, timed in the device process.

The table gives the medians and whether (c) is within 2 % of the better of (a) and (b) (by their
medians), and the paired figure: the median over rounds of (c) / that choice in the same round.

Run (root: network namespaces and cgroups), under the timing lock:
  flock /tmp/edgesplit-timing.lock .venv/bin/python benchmarks/generate_offload.py \
      [--model decoder_100m] [--prompt-tokens 128] [--new-tokens 16] [--bands 5,50,200]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from netlab import CpuQuota, NetLab, serve_command, wait_ready  # noqa: E402
from offload_sweep import DEVICE_SPEC, ROOFLINE, RTT_MS  # noqa: E402

GAP_S = 0.3  # between generations, for each configuration alike
CONFIGS = ("local", "offload", "plan")

WORKER = textwrap.dedent("""
    import json, statistics, sys, time
    import onnx
    from edgesplit.device.spec import load_device
    from edgesplit.generate.offload import RemotePrefill, measure_server_prefill
    from edgesplit.generate.phase_measure import (MeasureOptions, measure_phases, open_runner,
                                                  random_prompt)
    from edgesplit.generate.phases import choose_per_band
    from edgesplit.model.zoo_decoder import config_of
    from edgesplit.runtime.client import OipClient
    import dataclasses
    state = {}
    for line in sys.stdin:
        job = json.loads(line)
        try:
            if job["kind"] == "plan":
                model = onnx.load(job["model"])
                spec = load_device(job["spec"])
                P, N = job["prompt_tokens"], job["new_tokens"]
                opts = MeasureOptions(chunk_candidates=tuple(job["chunks"]), repeats=3)
                prof = measure_phases(model, spec, (P, N), opts)
                config = config_of(model)
                client = OipClient(job["url"], timeout_s=600)
                remote = RemotePrefill(client, "p0", config, timeout_s=600)
                prompt = random_prompt(config.vocab_size, P, seed=7)
                figs = measure_server_prefill(remote, prompt, repeats=5)
                link = (job["bands"][0], job["bands"][0], job["rtt_ms"])
                server = figs.pricing("lab-server", link)
                prof = dataclasses.replace(prof, server=server)
                plans = choose_per_band(prof, job["bands"])
                runner = open_runner(spec.processors[0], model)
                state.update(model=model, runner=runner, remote=remote, prompt=prompt, N=N)
                out = {"figures": dataclasses.asdict(figs), "plans": [p.to_json() for p in plans]}
            else:
                runner, N, prompt = state["runner"], state["N"], state["prompt"]
                offload = job["chunk"] is None
                gen = runner.generator(state["model"], 0 if offload else job["chunk"])
                kw = {"prefill": state["remote"]} if offload else {}
                t0 = time.perf_counter()
                tokens = runner.call(lambda: list(gen.generate(prompt, N, **kw)))
                total = (time.perf_counter() - t0) * 1e3
                st = gen.last_stats
                out = {"total_ms": total, "ttft_ms": st.ttft_ms, "decode_ms": st.decode_ms,
                       "tokens": tokens}
            print(json.dumps(out), flush=True)
        except Exception as e:
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
""")


class Device:
    """The device worker process, inside the CPU quota."""

    def __init__(self, quota: CpuQuota):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            quota.wrap([sys.executable, "-c", WORKER]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def job(self, **job) -> dict:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        if "error" in out:
            raise RuntimeError(f"device worker: {out['error']}")
        return out

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def build(args, tmp: Path) -> tuple[Path, Path, Path]:
    """The decoder, its one-part bundle (dynamic lengths) and the lab device spec."""
    from edgesplit.compile.manual import contiguous_plan
    from edgesplit.model import zoo
    from edgesplit.model.load import load_model
    from edgesplit.model.zoo_decoder import SIZES
    from edgesplit.workflows.compile import compile_bundle

    c = SIZES[args.model]
    model = zoo.save(args.model, tmp / f"{args.model}.onnx")
    shapes = {"input_ids": (1, 1), "attention_mask": (1, 5), "position_ids": (1, 1)}
    for i in range(c.layers):
        for kv in ("key", "value"):
            shapes[f"past_key_values.{i}.{kv}"] = (1, c.kv_heads, 4, c.head_dim)
    graph = load_model(model, shapes)
    plan = contiguous_plan(graph, "host-biglittle", [("big", "ort")])
    compile_bundle(graph, plan, tmp / "bundle")
    spec = tmp / "lab-device.yaml"
    peak, bw, launch = (
        ROOFLINE[k] for k in ("peak_gflops", "mem_bandwidth_gbps", "launch_overhead_ms")
    )
    spec.write_text(
        DEVICE_SPEC.format(
            quota=args.quota_pct, peak=peak * args.quota_pct / 100, bw=bw, launch=launch
        )
    )
    return model, tmp / "bundle", spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="decoder_100m")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--bands", default="5,50,200", help="link rates (Mbit/s), both ways")
    ap.add_argument("--chunks", default="32,64,128", help="local prefill chunk sizes to price")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quota-pct", type=float, default=25)
    ap.add_argument("--server-threads", type=int, default=1, help="the server's ORT threads")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    bands = [float(x) for x in args.bands.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="edgesplit-genoff-"))
    t0 = time.time()
    model, bundle, spec = build(args, tmp)
    print(f"built {args.model} and its bundle in {time.time() - t0:.0f} s", flush=True)
    with CpuQuota(args.quota_pct) as quota, NetLab(bands[0], RTT_MS) as lab:
        extra = ("--all-parts", "--intra-op-threads", str(args.server_threads))
        server = lab.spawn(
            serve_command(bundle, lab.server_ip, 8000, *extra), stderr=subprocess.PIPE
        )
        url = f"http://127.0.0.1:{lab.relay(8000).port}"
        wait_ready(url, server, timeout_s=300)
        device = Device(quota)
        lab._procs.append(device.proc)  # stopped with the lab, even on failure
        try:
            t0 = time.time()
            planned = device.job(
                kind="plan", model=str(model), spec=str(spec), url=url, bands=bands,
                prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens,
                chunks=[int(c) for c in args.chunks.split(",")], rtt_ms=RTT_MS,
            )  # fmt: skip
            print(f"profiled in {time.time() - t0:.0f} s (measured at {bands[0]} Mbit/s)")
            print(f"server figures: {json.dumps(planned['figures'])}", flush=True)
            rows = [
                measure_band(args, lab, device, rate, plan)
                for rate, plan in zip(bands, planned["plans"])
            ]
        finally:
            device.close()
    summary(args, rows)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"figures": planned["figures"], "rows": rows}, indent=1)
        )


def measure_band(args, lab: NetLab, device: Device, rate: float, plan: dict) -> dict:
    lab.set_rate(rate)
    cands = plan["candidates"]
    best_local = next(c for c in cands if not c["offloaded"])
    best_off = next(c for c in cands if c["offloaded"])
    chosen = plan["chosen"]
    chunk = {
        "local": best_local["chunk_tokens"],
        "offload": None,
        "plan": None if chosen["offloaded"] else chosen["chunk_tokens"],
    }
    for kind in CONFIGS:  # warm: the connection, the caches, the link's state
        device.job(kind="run", chunk=chunk[kind])
        time.sleep(GAP_S)
    runs: dict[str, list[dict]] = {k: [] for k in CONFIGS}
    orders = list(itertools.permutations(CONFIGS))
    for r in range(args.rounds):
        for kind in orders[r % len(orders)]:
            runs[kind].append(device.job(kind="run", chunk=chunk[kind]))
            time.sleep(GAP_S)
    med = {k: statistics.median(x["total_ms"] for x in v) for k, v in runs.items()}
    ttft = {k: statistics.median(x["ttft_ms"] for x in v) for k, v in runs.items()}
    same = all(x["tokens"] == runs["local"][0]["tokens"] for v in runs.values() for x in v)
    row = {
        "rate_mbps": rate,
        "chosen": chosen,
        "pred": {"local": best_local["total_ms"], "offload": best_off["total_ms"]},
        "pred_ttft": {"local": best_local["ttft_ms"], "offload": best_off["ttft_ms"]},
        "median_ms": med,
        "ttft_ms": ttft,
        "totals_ms": {k: [round(x["total_ms"], 1) for x in v] for k, v in runs.items()},
        "local_chunk": best_local["chunk_tokens"],
        "same_tokens": same,
    }
    best = "local" if med["local"] <= med["offload"] else "offload"
    row["best_fixed"] = best
    row["plan_over_best"] = med["plan"] / med[best]
    pairs = [p / b for p, b in zip(row["totals_ms"]["plan"], row["totals_ms"][best])]
    row["plan_over_best_paired"] = statistics.median(pairs)
    print(
        f"{rate:>6g} Mbit/s  plan: {'offload' if chosen['offloaded'] else 'local'}  "
        f"local {med['local']:.0f} ms (pred {best_local['total_ms']:.0f})  offload "
        f"{med['offload']:.0f} ms (pred {best_off['total_ms']:.0f})  plan {med['plan']:.0f} ms  "
        f"plan/best {row['plan_over_best']:.3f} (paired {row['plan_over_best_paired']:.3f})  "
        f"tokens equal: {same}",
        flush=True,
    )
    return row


def summary(args, rows: list[dict]) -> None:
    print()
    print(
        f"{args.model}, P={args.prompt_tokens}, N={args.new_tokens}, device {args.quota_pct:g}% "
        f"of a core, server {args.server_threads} thread(s), RTT {RTT_MS:g} ms, "
        f"{args.rounds} rounds, medians"
    )
    print(
        "| Mbit/s | plan chooses | local prefill: pred / meas ms (TTFT) | server prefill: pred / "
        "meas ms (TTFT) | plan's choice meas ms | plan / best fixed (paired) | within 2% |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        m, p, t, pt = r["median_ms"], r["pred"], r["ttft_ms"], r["pred_ttft"]
        what = "server prefill" if r["chosen"]["offloaded"] else f"local (chunk {r['local_chunk']})"
        print(
            f"| {r['rate_mbps']:g} | {what} | {p['local']:.0f} / {m['local']:.0f} "
            f"({pt['local']:.0f} / {t['local']:.0f}) | {p['offload']:.0f} / {m['offload']:.0f} "
            f"({pt['offload']:.0f} / {t['offload']:.0f}) | {m['plan']:.0f} | "
            f"{r['plan_over_best']:.3f} ({r['plan_over_best_paired']:.3f}) | "
            f"{'yes' if r['plan_over_best'] <= 1.02 else 'NO'} |"
        )


if __name__ == "__main__":
    main()
