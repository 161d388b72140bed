"""Time to profile a zoo model remotely (over a local OpenSSH sshd) against locally.

Starts its own sshd on 127.0.0.1 (as the tests do), so the remote run pays everything a real one
does except the network: SSH connect and auth, one exec_command, the agent upload, the model
upload, remote model loading and profiling, the JSON back. Both runs use the same machine, so the
difference is the overhead of going remote.

    .venv/bin/python benchmarks/remote_profile.py [--model resnet18] [--backend ort] [--runs 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument(
        "--backend",
        action="append",
        choices=["ort", "tvm"],
        help="repeatable; default both (TVM takes ~20 s on resnet18 here)",
    )
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()

    from sshd import start_sshd

    from edgesplit.device.spec import load_device
    from edgesplit.model import zoo
    from edgesplit.model.load import load_model
    from edgesplit.profile.remote import RemoteOptions, profile_remote
    from edgesplit.profile.run import ProfileOptions
    from edgesplit.profile.ssh import SshOptions
    from edgesplit.profile.steps import profile_steps

    with tempfile.TemporaryDirectory(prefix="edgesplit-bench-") as tmp:
        tmp_path = Path(tmp)
        model = zoo.save(args.model, tmp_path / f"{args.model}.onnx")
        size_mb = model.stat().st_size / 1e6
        options = ProfileOptions(args.backend, runs=args.runs, warmup=args.warmup)

        t0 = time.perf_counter()
        local = profile_steps(load_model(model), load_device("host"), options)
        local_s = time.perf_counter() - t0

        server = start_sshd(tmp_path / "sshd")
        try:
            remote_tmp = tmp_path / "remote-tmp"
            remote_tmp.mkdir()
            opts = SshOptions(
                identity=str(server.identity),
                known_hosts=str(server.known_hosts),
                remote_python=sys.executable,
                remote_tmpdir=str(remote_tmp),
            )
            marks: dict[str, float] = {}
            t0 = time.perf_counter()
            remote = profile_remote(
                model,
                server.target,
                RemoteOptions(opts),
                output=tmp_path / "remote.json",
                options=options,
                on_event=lambda ev: marks.setdefault(ev["event"], time.perf_counter() - t0),
            )
            remote_s = time.perf_counter() - t0
            left = list(remote_tmp.iterdir())
        finally:
            server.stop()

    print(
        f"model {args.model}, backends {', '.join(e.key for e in local.entries)}, runs "
        f"{args.runs}, "
        f"warmup {args.warmup}"
    )
    print(f"local : {local_s:7.2f} s")
    print(
        f"remote: {remote_s:7.2f} s  ({remote_s / local_s:.2f}x local, {remote_s - local_s:+.2f} s)"
    )
    ready, stored, plan = marks.get("ready", 0), marks.get("stored", 0), marks.get("plan", 0)
    print(
        f"  connect + start agent {ready:6.2f} s | upload {size_mb:.0f} MB {stored - ready:5.2f} s "
        "| "
        f"load model there {plan - stored:6.2f} s | profile + fetch {remote_s - plan:6.2f} s"
    )
    for le, re_ in zip(local.entries, remote.entries):
        print(
            f"  {le.key}: whole model {le.whole_model_ms or 0:.2f} ms here, "
            f"{re_.whole_model_ms or 0:.2f} ms "
            f"remote; nodes {len(le.nodes)} / {len(re_.nodes)}"
        )
    print(f"remote temporary folders left: {len(left)}")


if __name__ == "__main__":
    main()
