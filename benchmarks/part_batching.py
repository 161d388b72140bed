"""How well one server part batches on this machine: its time at batch sizes 1, 2, 4, 8, 16.

The part of a zoo model between ``--inputs`` and ``--outputs`` (default: the whole model) is made
batch-free as ``edgesplit serve --max-batch`` makes it
(:func:`edgesplit.bundle.batching.free_batch`) and run in ONNX Runtime on random inputs, each batch
size ``--runs`` times after ``--warmup`` runs, with 1 and 2 threads (``--threads``). It prints the
median per batch and per request. A part bound by reading its weights (a fully connected head
larger than the caches) costs little more per batch than per request; a part bound by its FLOPs
(convolutions, a transformer over 128 tokens) costs the same per request at any batch size.

Run: PYTHONPATH=. .venv/bin/python benchmarks/part_batching.py alexnet --inputs flatten
     [--outputs logits] [--batches 1,2,4,8,16] [--threads 1,2] [--runs 15]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    import onnx
    import onnxruntime as ort
    from onnx import helper, shape_inference, utils

    from edgesplit.bundle.batching import free_batch
    from edgesplit.bundle.format import TensorSpec
    from edgesplit.model import zoo

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a zoo model")
    ap.add_argument("--inputs", default=None, help="the part's input tensors, comma-separated")
    ap.add_argument("--outputs", default=None, help="its output tensors (default: the model's)")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()

    model = shape_inference.infer_shapes(zoo.build(args.model))
    g = model.graph
    ins = args.inputs.split(",") if args.inputs else [i.name for i in g.input]
    outs = args.outputs.split(",") if args.outputs else [o.name for o in g.output]
    part = utils.Extractor(model).extract_model(ins, outs)
    infos = {v.name: v for v in [*g.input, *g.value_info, *g.output]}

    def spec(name: str) -> TensorSpec:
        tt = infos[name].type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type).name
        return TensorSpec(name, tuple(d.dim_value for d in tt.shape.dim), dtype)

    found = free_batch(part.SerializeToString(), [spec(i) for i in ins], [spec(o) for o in outs])
    if not found.ok:
        raise SystemExit(f"the part cannot be batched: {found.reason}")
    weights = sum(
        int(np.prod(t.dims)) * 4 for t in onnx.load_from_string(found.onnx_bytes).graph.initializer
    )
    print(f"{args.model} part {ins} -> {outs}: {weights / 1e6:.1f} MB of weights")
    rng = np.random.default_rng(0)
    for threads in (int(t) for t in args.threads.split(",")):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        sess = ort.InferenceSession(found.onnx_bytes, so, providers=["CPUExecutionProvider"])
        one = None
        for b in (int(x) for x in args.batches.split(",")):
            feeds = {
                i: rng.standard_normal((b * spec(i).shape[0], *spec(i).shape[1:])).astype(
                    np.float32
                )
                for i in ins
            }
            for _ in range(args.warmup):
                sess.run(None, feeds)
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                sess.run(None, feeds)
                times.append((time.perf_counter() - t0) * 1e3)
            ms = float(np.median(times))
            one = ms if one is None else one
            print(
                f"threads {threads} batch {b:>2}: {ms:8.2f} ms, {ms / b:7.2f} ms a request "
                f"({one * b / ms:.1f}x the requests a second of batch 1)"
            )


if __name__ == "__main__":
    main()
