"""ONNX's backend test models through ONNX Runtime and through edgesplit's whole pipeline.

Every case of ``node``, ``simple``, ``pytorch-converted``, ``pytorch-operator`` and ``real`` (the
models the ``onnx`` wheel ships; ``tests/conformance_kit.py``) runs once in ONNX Runtime on the
original model (the denominator: what ORT itself passes here) and once through edgesplit: load,
profile and partition on ``host-2core`` with pins that cut it into up to three parts, compile, run
the bundle, compare with the expected outputs at the case's tolerances.

Cases run in a child process, one after another; a case that gives no answer within
``--case-limit-s`` is recorded as ``hang`` and the child is replaced (so is one that crashes).
Prints a table per folder and writes every case's result as JSON.

    chrt -i 0 nice -n 19 .venv/bin/python benchmarks/conformance.py [--folders node,simple] \
        [--sample N --seed S] [--jobs 2] [-o conformance.json]
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import conformance_kit as kit  # noqa: E402

STARTUP_S = 900.0  # the worker builds its cases first (the node cases, the real models' inputs)


def _worker(folder: str, keys: list[str], runs: int) -> None:
    """Run the named cases of ``folder``; one JSON line per case on stdout ("start" first)."""
    os.environ.setdefault("EDGESPLIT_CACHE", tempfile.mkdtemp(prefix="conformance-cache-"))
    wanted = set(keys)
    found = {c.key: c for c in kit.cases(folder) if c.key in wanted}
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever the pipeline prints must not mix with the results
    print(json.dumps({"ready": len(found)}), file=out, flush=True)
    with tempfile.TemporaryDirectory(prefix="conformance-") as tmp:
        for i, key in enumerate(keys):
            print(json.dumps({"start": key}), file=out, flush=True)
            case = found[key]
            t0 = time.perf_counter()
            ort = kit.run_ort(case)
            t1 = time.perf_counter()
            es = kit.run_edgesplit(case, Path(tmp) / str(i), runs=runs)
            t2 = time.perf_counter()
            row = {
                "key": key,
                "ort": list(ort),
                "edgesplit": [es.stage, es.reason],
                "parts": es.parts,
                "ops": sorted({n.op_type for n in case.model.graph.node}),
                "crossing": list(es.crossing),
                "ort_s": round(t1 - t0, 3),
                "edgesplit_s": round(t2 - t1, 3),
            }
            print(json.dumps(row), file=out, flush=True)


def _wait(sel: selectors.BaseSelector, limit_s: float) -> bool:
    """Whether the child says something within ``limit_s`` of running time: waited in 1 s steps,
    each counted as at most 2 s, so that time this process spent stopped (a SIGSTOP while another
    job measures, as ``quiet`` does to SCHED_IDLE work) does not count as the child hanging."""
    waited = 0.0
    while waited < limit_s:
        t0 = time.monotonic()
        if sel.select(timeout=min(1.0, limit_s - waited)):
            return True
        waited += min(time.monotonic() - t0, 2.0)
    return False


def _run_folder(folder: str, keys: list[str], args: argparse.Namespace) -> list[dict]:
    """The cases' rows, from children that are replaced when one hangs or dies."""
    rows: list[dict] = []
    todo = list(keys)
    while todo:
        cmd = [sys.executable, __file__, "--worker", folder, "--runs", str(args.runs), *todo]
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert child.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(child.stdout, selectors.EVENT_READ)
        current = None
        ready = False
        while True:
            if not _wait(sel, args.case_limit_s if ready else STARTUP_S):
                child.kill()
                if not ready:
                    raise SystemExit(f"{folder}: the worker did not start within {STARTUP_S:g} s")
                if (
                    current is not None
                ):  # (None: silent between two cases, say stopped: start again)
                    why = f"no answer within {args.case_limit_s:g} s"
                    rows.append({"key": current, "ort": ["?", ""], "edgesplit": ["hang", why]})
                break
            line = child.stdout.readline()
            if not line:
                child.wait()
                if current is None and not ready:
                    raise SystemExit(
                        f"{folder}: the worker died before it started (exit {child.returncode})"
                    )
                if current is not None:
                    rows.append(
                        {
                            "key": current,
                            "ort": ["?", ""],
                            "edgesplit": ["crash", f"exit {child.returncode}"],
                        }
                    )
                break
            msg = json.loads(line)
            if "ready" in msg:
                ready = True
                continue
            if "start" in msg:
                current = msg["start"]
                continue
            rows.append(msg)
            current = None
            if not args.quiet:
                es = msg["edgesplit"]
                print(
                    f"  {msg['key']}: ort {msg['ort'][0]}, edgesplit {es[0]} {es[1][:100]}",
                    flush=True,
                )
        child.wait()
        sel.close()
        done = {r["key"] for r in rows}
        todo = [k for k in todo if k not in done]
    return rows


def _counts(rows: list[dict]) -> dict:
    ort_pass = {r["key"] for r in rows if r["ort"][0] == "pass"}
    es_pass = {r["key"] for r in rows if r["edgesplit"][0] == "pass"}
    return {
        "cases": len(rows),
        "ort_pass": len(ort_pass),
        "edgesplit_pass": len(es_pass),
        "edgesplit_pass_of_ort_pass": len(es_pass & ort_pass),
        "edgesplit_pass_ort_fails": len(es_pass - ort_pass),
    }


def _op_coverage(rows: list[dict]) -> dict:
    """Op types of the models edgesplit passes, and those of them that crossed a part boundary."""
    passing = [r for r in rows if r["edgesplit"][0] == "pass"]
    seen = sorted({op for r in passing for op in r.get("ops", ())})
    crossing = sorted({op for r in passing for op in r.get("crossing", ())})
    return {
        "in_passing_models": seen,
        "crossing": crossing,
        "never_crossing": sorted(set(seen) - set(crossing)),
    }


def _against_known(rows: list[dict]) -> dict:
    """Failures of ORT-passing models missing from the known-failures file, lines whose model
    passes now (stale), and lines whose model fails at another stage."""
    known = kit.known_failures()
    failing = {
        r["key"]: r["edgesplit"][0]
        for r in rows
        if r["edgesplit"][0] != "pass" and r["ort"][0] == "pass"
    }
    ran = {r["key"] for r in rows}
    return {
        "unlisted": sorted(k for k in failing if k not in known),
        "stale": sorted(k for k in known if k in ran and k not in failing),
        "other_stage": sorted(k for k, st in failing.items() if k in known and known[k][0] != st),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folders", default=",".join(kit.FOLDERS))
    ap.add_argument(
        "--sample", type=int, default=0, help="a seeded sample of this many cases per folder"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=1, help="timed runs per profiled kernel")
    ap.add_argument(
        "--case-limit-s", type=float, default=120.0, help="a case silent this long is a hang"
    )
    ap.add_argument(
        "--jobs", type=int, default=1, help="cases run at once, each in a child process"
    )
    ap.add_argument("-o", "--out", default="conformance.json")
    ap.add_argument("-q", "--quiet", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("keys", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.worker, args.keys, args.runs)
        return
    report: dict = {"folders": {}, "cases": {}}
    t_all = time.perf_counter()
    for folder in args.folders.split(","):
        found = kit.cases(folder)
        chosen = kit.sample(found, args.sample, args.seed) if args.sample else found
        t0 = time.perf_counter()
        keys = [c.key for c in chosen]
        with ThreadPoolExecutor(args.jobs) as pool:  # each shard in a child process of its own
            shards = [
                pool.submit(_run_folder, folder, keys[k :: args.jobs], args)
                for k in range(args.jobs)
            ]
            rows = sorted((r for shard in shards for r in shard.result()), key=lambda r: r["key"])
        counts = {**_counts(rows), "seconds": round(time.perf_counter() - t0, 1)}
        report["folders"][folder] = counts
        report["cases"].update({r["key"]: {k: v for k, v in r.items() if k != "key"} for r in rows})
        print(f"{folder}: {json.dumps(counts)}", flush=True)
    rows = [{"key": k, **v} for k, v in report["cases"].items()]
    report["total"] = {**_counts(rows), "seconds": round(time.perf_counter() - t_all, 1)}
    report["op_types"] = _op_coverage(rows)
    report["known_failures"] = _against_known(rows)
    print(
        f"{'folder':<18} {'cases':>5} {'ORT passes':>10} {'edgesplit':>9} {'of ORT':>7} "
        f"{'share':>7}"
    )
    for folder, c in [*report["folders"].items(), ("total", report["total"])]:
        share = c["edgesplit_pass_of_ort_pass"] / c["ort_pass"] if c["ort_pass"] else 1.0
        print(
            f"{folder:<18} {c['cases']:>5} {c['ort_pass']:>10} {c['edgesplit_pass']:>9} "
            f"{c['edgesplit_pass_of_ort_pass']:>7} {share:>7.1%}"
        )
    cov = report["op_types"]
    print(
        f"op types crossing a part boundary: {len(cov['crossing'])} of "
        f"{len(cov['in_passing_models'])}"
    )
    known = report["known_failures"]
    for what in ("unlisted", "stale", "other_stage"):
        if known[what]:
            print(f"known failures, {what}: {', '.join(known[what])}")
    tmp = Path(args.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
