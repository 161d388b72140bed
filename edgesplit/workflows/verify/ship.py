"""Verify a plan by measurement on the target, and ship the measured winner as the bundle.

:func:`verify_plan` builds every candidate (:mod:`edgesplit.workflows.verify.candidates`) as a real
bundle,
measures them against each other in alternating rounds (:mod:`edgesplit.workflows.verify.measure`),
picks
what to ship (:mod:`edgesplit.workflows.verify.decide`), and writes that candidate's bundle at
``out`` with
the verdict in its manifest (:class:`~edgesplit.bundle.verdict.Verification`).

Candidates with parts on a server need a server that runs those parts: a launcher
(:attr:`VerifyOptions.serve`, which starts one for a candidate's bundle and gives its URL; the CLI's
``--server-url local`` starts ``edgesplit serve`` in this process), or the URL of a running
offload server, which must already serve the candidate's parts (checked by their metadata). With
neither, remote candidates are listed as skipped, and a plan with server parts is kept unverified.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from edgesplit.bundle.format import Manifest, open_bundle, write_manifest
from edgesplit.bundle.signing import load_private_key
from edgesplit.bundle.verdict import Verification
from edgesplit.compile.build import CompileOptions, check_output
from edgesplit.errors import EdgesplitError
from edgesplit.optimize.plan import Plan
from edgesplit.util import Progress, atomic_dir
from edgesplit.workflows.resolve import Problem
from edgesplit.workflows.verify.accuracy import Measured, budget_of, measure_accuracy
from edgesplit.workflows.verify.candidates import (
    PLAN,
    Candidate,
    candidates,
    compile_candidates,
    stage_dir,
)
from edgesplit.workflows.verify.decide import decide, metric_for, rows
from edgesplit.workflows.verify.measure import (
    MAX_ROUNDS,
    MIN_ROUNDS,
    RACE_MARGIN,
    Measurement,
    measure,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

Launcher = Callable[[Path], AbstractContextManager[str]]

ENERGY_NOTE = (
    "energy is modelled, not measured (no power rails here): each candidate's predicted energy "
    "scaled by its measured over its predicted latency"
)


@dataclass(frozen=True)
class VerifyOptions:
    """How to verify.

    Attributes:
        budget_s: The most time measuring may take (warm-up and rounds; compiling the candidates
            and loading them come on top).
        server_url: A running offload server for candidates with server parts (it must serve them).
        token: Its bearer token.
        serve: Starts a server for one candidate's bundle and yields its URL (see the module doc);
            ``"local"`` is :func:`local_server`.
        min_rounds, max_rounds: Rounds of alternation; fewer than ``min_rounds`` is no verdict.
        keep_candidates: Keep the candidates' bundles in this folder (one per candidate, as
            ``<name>``) instead of deleting them; benchmarks measure them again.
    """

    budget_s: float = 30.0
    server_url: str | None = None
    token: str | None = None
    serve: Launcher | str | None = None
    min_rounds: int = MIN_ROUNDS
    max_rounds: int = MAX_ROUNDS
    keep_candidates: str | os.PathLike | None = None


@contextlib.contextmanager
def local_server(bundle: Path) -> Iterator[str]:
    """``edgesplit serve BUNDLE`` on 127.0.0.1 in this process, for as long as the block runs."""
    from edgesplit.serve.server import ServerThread

    with ServerThread(bundle) as srv:
        yield srv.url


def _served(c: Candidate, url: str, token: str | None) -> str | None:
    """Why the server at ``url`` cannot run ``c``'s server parts, or None when it can."""
    from edgesplit.runtime.client import OipClient

    client = OipClient(url, token=token, timeout_s=5.0, retries=0)
    try:
        if not client.live():
            return f"the server at {url} does not answer"
        man = open_bundle(c.bundle)
        for part in (p for p in man.parts if p.remote):
            try:
                meta = client.metadata(part.name)
            except EdgesplitError as e:
                return f"the server at {url} does not serve part {part.name} ({e})"
            want = {(t.name, tuple(t.shape)) for t in (*part.inputs, *part.outputs)}
            got = {
                (t["name"], tuple(t["shape"]))
                for t in (*meta.get("inputs", ()), *meta.get("outputs", ()))
            }
            if want != got:
                return (
                    f"the server at {url} serves another part {part.name} (serve this "
                    "candidate's bundle)"
                )
        return None
    finally:
        client.close()


def _servers(
    cands: list[Candidate], options: VerifyOptions, stack: ExitStack
) -> tuple[list[Candidate], dict]:
    """A server URL for each remote candidate (started or checked); the others get an error."""
    launch = local_server if options.serve == "local" else options.serve
    urls, out = {}, []
    for c in cands:
        if not (c.remote and c.measurable and c.bundle is not None):
            out.append(c)
            continue
        try:
            if launch is not None:
                urls[c.name] = stack.enter_context(launch(c.bundle))  # type: ignore[operator]
            elif options.server_url:
                why = _served(c, options.server_url, options.token)
                if why:
                    out.append(replace(c, error=why))
                    continue
                urls[c.name] = options.server_url
        except Exception as e:  # noqa: BLE001 - a server that cannot start disqualifies the candidate
            out.append(replace(c, error=f"no server for it: {e}"))
            continue
        out.append(c)
    return out, urls


def _no_server(cands: list[Candidate], options: VerifyOptions) -> tuple[list[Candidate], list[str]]:
    """Without a server, remote candidates are skipped (listed with the reason)."""
    if options.serve is not None or options.server_url or not any(c.remote for c in cands):
        return cands, []
    why = "skipped: it has server parts and no server URL was given (--server-url)"
    out = [
        replace(c, error=why) if c.remote and c.error is None and c.name != PLAN else c
        for c in cands
    ]
    return out, [
        "remote candidates were skipped: no server URL was given (--server-url URL, or local)"
    ]


def _unverifiable(problem: Problem, plan: Candidate, options: VerifyOptions) -> str | None:
    """Why the plan cannot be measured at all (then it is shipped unverified), or None."""
    if not problem.device.local:
        return (
            f"the device '{problem.device.name}' is not this machine, and a plan is verified on "
            "its target"
        )
    if plan.remote and options.serve is None and not options.server_url:
        return "the plan has server parts and no server URL was given (--server-url)"
    return None


def _ship(
    cands: list[Candidate],
    shipped: str,
    out: str | os.PathLike,
    verdict: Verification,
    key: Ed25519PrivateKey | None,
) -> Manifest:
    """Move the shipped candidate's bundle to ``out`` (atomically), its manifest with the verdict
    (signed with ``key``, when given, after the verdict is in)."""
    by_name = {c.name: c for c in cands}
    c = by_name[shipped]
    src = by_name[c.same_as].bundle if c.same_as else c.bundle
    assert src is not None
    manifest = replace(open_bundle(src), verification=verdict)
    with atomic_dir(out) as tmp:
        for child in src.iterdir():
            os.replace(child, tmp / child.name)
        write_manifest(tmp, manifest, key)
    return manifest


def _keep(stage: Path, cands: list[Candidate], keep: str | os.PathLike | None) -> None:
    if keep is not None:
        dest = Path(keep)
        dest.mkdir(parents=True, exist_ok=True)
        for c in cands:
            if (
                c.bundle is not None and (c.bundle / "manifest.json").is_file()
            ):  # not the shipped one
                target = dest / c.name.replace(":", "-").replace("/", "-")
                shutil.rmtree(target, ignore_errors=True)
                os.replace(c.bundle, target)
    shutil.rmtree(stage, ignore_errors=True)


def _measure(
    problem: Problem,
    cands: list[Candidate],
    metric: str,
    options: VerifyOptions,
    progress: Progress | None,
) -> tuple[list[Candidate], Measurement, dict[str, Measured], float]:
    """With the candidates' servers up: their accuracy (those with int8/fp16 parts), then their
    latency or throughput; also the seconds the accuracy took."""
    with ExitStack() as stack:
        cands, urls = _servers(cands, options, stack)
        if cands[0].error is not None:  # no server for the plan's own parts: it cannot be verified
            return (
                cands,
                Measurement({}, {}, 0, 0.0, f"the plan cannot be measured: {cands[0].error}"),
                {},
                0.0,
            )

        def executor_options(name: str) -> Mapping | None:
            if name not in urls:
                return None
            return {"remote": {"url": urls[name], "token": options.token, "fallback": False}}

        t0 = time.perf_counter()
        cands, accuracy = measure_accuracy(problem, cands, executor_options)
        accuracy_s = time.perf_counter() - t0
        ready = [c for c in cands if c.measurable and c.bundle is not None]
        bundles = {
            c.name: c.bundle for c in sorted(ready, key=lambda c: len(c.plan.parts))
        }  # cheap first
        meas = measure(
            bundles,
            "throughput" if metric == "throughput" else "latency",
            options.budget_s,
            executor_options=executor_options,
            min_rounds=options.min_rounds,
            max_rounds=options.max_rounds,
            progress=progress,
            race=None if metric == "energy" else _pace(bundles, accuracy),
        )
    return cands, meas, accuracy, accuracy_s


def _stopped_note(meas: Measurement) -> str:
    who = ", ".join(f"{n} after {k}" for n, k in meas.stopped.items())
    return (
        f"raced: stopped measuring {who} round(s), each slower than the fastest by more than "
        f"{RACE_MARGIN:.0%} in every round; the others took {meas.rounds} rounds"
    )


def _pace(bundles: Mapping[str, Path], accuracy: Mapping[str, Measured]) -> set[str]:
    """The candidates that may set a race's pace: those not measured to miss the accuracy budget
    (energy is not raced: it is latency times each candidate's own power)."""
    return {n for n in bundles if not (n in accuracy and accuracy[n].misses)}


def _verdict(
    table: list,
    metric: str,
    meas: Measurement,
    options: VerifyOptions,
    notes: list[str],
    accuracy_budget: str,
    timing: Mapping[str, float],
) -> Verification:
    """The verdict: what to ship (:func:`~edgesplit.workflows.verify.decide.decide`), with every
    figure."""
    shipped, reason, low, high = decide(table, metric, meas.short, options.min_rounds)
    return Verification(
        metric=metric,
        shipped=shipped,
        kept_plan=shipped == PLAN,
        reason=reason,
        candidates=tuple(table),
        rounds=meas.rounds,
        requests_per_turn=meas.requests_per_turn,
        budget_s=options.budget_s,
        measure_s=round(meas.elapsed_s, 3),
        load_s=round(meas.load_s, 3),
        plan_ratio_low=low,
        plan_ratio_high=high,
        notes=tuple(notes),
        accuracy_budget=accuracy_budget,
        **timing,
    )


def verify_plan(
    problem: Problem,
    plan: Plan,
    out: str | os.PathLike,
    *,
    options: VerifyOptions = VerifyOptions(),
    bands: bool = True,
    **compiling: Unpack[CompileOptions],
) -> Manifest:
    """Measure ``plan`` against the best baselines here and write the winner's bundle at ``out``.

    Candidates with int8/fp16 parts have their accuracy measured against fp32 first
    (:mod:`edgesplit.workflows.verify.accuracy`); one that misses the problem's budget is never
    shipped.

    ``out`` is refused as ``compile`` refuses it (an existing folder that is neither empty nor a
    bundle, unless ``force``); with ``sign_key`` the shipped manifest, verdict included, is signed.

    ``compiling``: :class:`~edgesplit.compile.build.CompileOptions` (tuning, ``progress``,
    ``force``,
    ``sign_key``; the accuracy is measured here, not by the compile).

    Returns:
        The shipped bundle's manifest; ``manifest.verification`` says what was measured, what was
        shipped and why (``manifest.plan`` is the shipped candidate's plan).

    Raises:
        CompileError, PlanError: when the plan itself cannot be compiled; PlanError when it misses
            the accuracy budget and no other candidate that meets it could be built.
    """
    sign_key, force, progress = (
        compiling.get("sign_key"),
        compiling.get("force", False),
        compiling.get("progress"),
    )
    tune_trials, tune = compiling.get("tune_trials", 0), compiling.get("tune")
    key = load_private_key(sign_key) if sign_key is not None else None
    check_output(out, force, [problem.graph.path])
    metric = metric_for(plan.objective)
    cands, notes = _no_server(candidates(problem, plan, metric), options)
    if metric == "energy":
        notes.append(ENERGY_NOTE)
    unverifiable = _unverifiable(problem, cands[0], options)
    stage = stage_dir(out)
    try:
        t0 = time.perf_counter()
        to_build = cands[:1] if unverifiable else cands
        built = compile_candidates(
            problem,
            to_build,
            stage,
            tune_trials=tune_trials,
            tune=tune,
            progress=progress,
            bands=bands,
            check_accuracy=bool(unverifiable),  # else measured below, for every candidate
        )
        cands = built + cands[len(built) :]
        compile_s = time.perf_counter() - t0
        accuracy: dict[str, Measured] = {}
        accuracy_s = 0.0
        if unverifiable:
            meas = Measurement({}, {}, 0, 0.0, unverifiable)
        else:
            cands, meas, accuracy, accuracy_s = _measure(problem, cands, metric, options, progress)
        timing = {"compile_s": round(compile_s, 3), "accuracy_s": round(accuracy_s, 3)}
        if meas.stopped:
            notes.append(_stopped_note(meas))
        table = rows(cands, meas, metric, accuracy)
        verdict = _verdict(
            table, metric, meas, options, notes, budget_of(problem).summary(), timing
        )
        shipped = verdict.shipped
        return _ship(cands, shipped, out, verdict, key)
    finally:
        _keep(stage, cands, options.keep_candidates)
