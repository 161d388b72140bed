"""Write the Android demo's assets: a small bundle of tiny_dag and a picture to classify.

    .venv/bin/python apps/android-demo/tools/make_assets.py [--out
    apps/android-demo/app/src/main/assets]

The plan is made by hand so that the demo exercises every path of the runtime on the phone: two
parts that run at the same time on different processors (p1 on the GPU, which the phone runs on
its CPU because ONNX Runtime's Android package has no QNN, and p2 on the little cores), and a
server part (p3) with a local fallback. Its predicted figures are roofline estimates from the
device spec and the Wi-Fi link preset, computed here as the optimiser would (critical path of the
parts plus the transfer to and from the server; device energy of the parts and of the radio).
For a model this small the server part costs more than it saves, and the prediction says so.

To put your own bundle on the phone instead, see the README (``edgesplit deploy`` then
``./gradlew copyBundle -PbundleDir=...``, or ``adb push`` into the app's files folder).
"""

from __future__ import annotations

import argparse
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np

DEVICE, SERVER, LINK = "snapdragon-8gen2", "server-a100", "wifi"
PARTS = [  # name, processor, nodes of tiny_dag
    ("p0", "cpu_big", ["stem.conv", "stem.relu"]),
    ("p1", "gpu", ["left.conv", "left.relu"]),
    ("p2", "cpu_little", ["right.conv"]),
    ("p3", f"{SERVER}.gpu", ["merge.add", "merge.concat", "pool", "flatten", "fc"]),
]


def plan_for(graph):
    from dataclasses import asdict

    from edgesplit.compile.manual import contiguous_plan, part_boundaries
    from edgesplit.device.spec import load_device, network_link
    from edgesplit.optimize.plan import Plan
    from edgesplit.profile.predict import roofline_ms

    spec = load_device(DEVICE).with_server(load_device(SERVER))
    link = network_link(LINK)
    plan = contiguous_plan(graph, DEVICE, [("cpu_big", "ort")] * len(PARTS)).to_json()
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    groups = [[index[n] for n in nodes] for _, _, nodes in PARTS]
    parts, producer, finish_ms, energy_mj = [], {}, {}, 0.0
    remote = {name: spec.processor(proc).is_remote for name, proc, _ in PARTS}
    for (name, proc_name, nodes), (ins, outs), group in zip(
        PARTS, part_boundaries(graph, groups), groups
    ):
        proc = spec.processor(proc_name)
        ms = sum(roofline_ms(graph.nodes[i], proc, graph) for i in group)
        # Tensors that cross the link share it, so their transfer times add up.
        crossing = [t for t in ins if remote.get(producer.get(t), False) != proc.is_remote]
        link_ms = sum(transfer_ms(graph, t, link, up=proc.is_remote) for t in crossing)
        start = max([finish_ms[producer[t]] for t in ins if t in producer], default=0.0) + link_ms
        if proc.is_remote:
            start += link.rtt_ms
            energy_mj += link_ms * link.tx_power_w
        else:
            energy_mj += ms * proc.active_w + link_ms * link.rx_power_w
        finish_ms[name] = start + ms
        producer.update({t: name for t in outs})
        parts.append(
            {
                "name": name,
                "processor": proc_name,
                "backend": "ort",
                "remote": proc.is_remote,
                "nodes": nodes,
                "inputs": ins,
                "outputs": outs,
                "latency_ms": round(ms, 4),
            }
        )
    last = max(finish_ms.values())
    if parts[-1]["remote"]:  # the logits come back down
        down_ms = sum(transfer_ms(graph, t, link, up=False) for t in parts[-1]["outputs"])
        last += down_ms
        energy_mj += down_ms * link.rx_power_w
    plan.update(
        {
            "server": SERVER,
            "link": asdict(link),
            "objective": "manual",
            "model_path": "tiny_dag.onnx",
            "parts": parts,
            "assignment": {
                n: {"processor": p, "backend": "ort"} for _, p, nodes in PARTS for n in nodes
            },
            "predicted": {"latency_ms": round(last, 3), "energy_mj": round(energy_mj, 3)},
            "solver": {
                "name": "manual (apps/android-demo/tools/make_assets.py, roofline figures)",
                "time_s": 0.0,
                "optimal": False,
                "gap": None,
            },
        }
    )
    return Plan.from_json(plan)


def transfer_ms(graph, tensor: str, link, *, up: bool) -> float:
    nbytes = graph.tensors[tensor].nbytes
    return nbytes * 8 / ((link.up_mbps if up else link.down_mbps) * 1e6) * 1e3


def write_png(path: Path, rgb: np.ndarray) -> None:
    """A plain 8-bit RGB PNG (no image library needed)."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\0" + rgb[y].astype(np.uint8).tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def picture(size: int = 64) -> np.ndarray:
    """A deterministic test card: a sky gradient, a sun and a green hill."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / (size - 1)
    img = np.stack([90 + 80 * y, 150 + 60 * y, 235 - 20 * y], axis=-1)
    sun = (x - 0.72) ** 2 + (y - 0.28) ** 2 < 0.018
    img[sun] = (250, 210, 60)
    hill = y > 0.62 + 0.12 * np.cos(3.2 * x)
    img[hill] = np.stack([40 + 30 * y, 140 + 40 * x, 50 + 0 * x], axis=-1)[hill]
    return np.clip(img, 0, 255)


def main() -> None:
    from edgesplit.model import zoo
    from edgesplit.model.load import load_model
    from edgesplit.workflows.compile import compile_bundle

    here = Path(__file__).resolve().parents[1]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=here / "app" / "src" / "main" / "assets")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / ".make_assets"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        graph = load_model(zoo.save("tiny_dag", work / "tiny_dag.onnx"))
        manifest = compile_bundle(graph, plan_for(graph), work / "bundle")
        shutil.rmtree(args.out / "bundle", ignore_errors=True)
        shutil.move(str(work / "bundle"), args.out / "bundle")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_png(args.out / "picture.png", picture())
    print(
        f"wrote {args.out / 'bundle'} ({len(manifest.parts)} parts, predicted "
        f"{manifest.plan.predicted.latency_ms} ms) and {args.out / 'picture.png'}"
    )


if __name__ == "__main__":
    main()
