"""``edgesplit fleet plan --bundles``: compile each group's chosen plan into a bundle and write one
Triton model repository for the server parts the groups share.

Groups whose plans are the same (same model file, same ``plan.json``) share one compile; the
bundle is copied into each group's folder. Per server part key (the model, server processor and
nodes: :mod:`edgesplit.fleet.candidates`) the first group's bundle is exported with
:func:`edgesplit.compile.triton.export_triton`, with the fleet's batching (``max_batch`` rows and
``max_queue_delay_ms``, as in ``serve.args``) and ``slots`` instances per model. Its models are
named ``<model>_<key digest>_<part>`` so that parts of different keys never collide and every
group of one key names the same Triton models: groups with the same split point batch together.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from edgesplit.fleet.price import Server

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def triton_prefix(key: str) -> str:
    """The Triton model name prefix of a server part key (``model@sha/procs/digest``)."""
    model = key.split("@", 1)[0]
    digest = key.rsplit("/", 1)[-1]
    return f"{_UNSAFE.sub('_', model).lstrip('.-') or 'model'}_{digest}"


def compile_groups(
    tmp: Path, groups: list[tuple[str, str, Any]], problems: dict[str, Any]
) -> dict[str, str]:
    """Compile ``tmp/groups/NAME/plan.json`` of each (name, model path, key) into
    ``tmp/groups/NAME/bundle``; groups with the same model and plan text share one compile
    (copied). Returns per group the group whose compile it copies (itself when compiled)."""
    from edgesplit.workflows.compile import compile_bundle

    done: dict[tuple[str, str], str] = {}
    source: dict[str, str] = {}
    for name, model, _key in groups:
        d = tmp / "groups" / name
        plan_text = (d / "plan.json").read_text()
        first = done.get((model, plan_text))
        if first is None:
            compile_bundle(model, d / "plan.json", d / "bundle", problem=problems[name])
            done[(model, plan_text)] = name
            source[name] = name
        else:
            shutil.copytree(tmp / "groups" / first / "bundle", d / "bundle", symlinks=True)
            source[name] = first
    return source


def _rename(pb, text: str, names: dict[str, str], instances: int):
    from google.protobuf import text_format

    config = text_format.Parse(text, pb.ModelConfig())
    config.name = names[config.name]
    for step in config.ensemble_scheduling.step:
        step.model_name = names[step.model_name]
    for group in config.instance_group:
        group.count = instances
    return config


def export_shared(tmp: Path, groups: list[tuple[str, str, Any]], server: Server) -> dict[str, Any]:
    """Write ``tmp/server/triton``: per server part key the models of its first group's bundle,
    renamed with :func:`triton_prefix`, batching and instances set from ``server``. Returns the
    report's ``triton`` section (per group its Triton models and the model prefix its bundle runs
    with, ``run --server-model-prefix``; per model the parts that did not batch and why)."""
    from edgesplit.compile.triton import config_text, export_triton, model_config_pb2

    pb = model_config_pb2()
    max_batch = server.max_batch if server.max_queue_delay_ms > 0 else 1
    repo = tmp / "server" / "triton"
    repo.mkdir(parents=True)
    per_key: dict[str, list[str]] = {}
    per_group: dict[str, list[str]] = {}
    prefixes: dict[str, str] = {}
    unbatched: dict[str, str] = {}
    for name, _model, key in groups:
        if key is None:
            per_group[name] = []
            continue
        if key not in per_key:
            part_repo = tmp / "server" / f".triton-{len(per_key)}"
            made = export_triton(
                tmp / "groups" / name / "bundle",
                part_repo,
                max_batch=max_batch,
                max_queue_delay_ms=server.max_queue_delay_ms if max_batch > 1 else 0.0,
            )
            prefix = triton_prefix(key)
            names = {m: f"{prefix}_{m}" for m in (*made.models, *made.ensembles)}
            for old, new in names.items():
                text = (part_repo / old / "config.pbtxt").read_text()
                config = _rename(pb, text, names, server.slots)
                (part_repo / old).rename(repo / new)
                (repo / new / "config.pbtxt").write_text(config_text(pb, config))
            part_repo.rmdir()
            per_key[key] = [names[m] for m in (*made.ensembles, *made.models)]
            unbatched.update({names[p]: why for p, why in made.unbatched})
        per_group[name] = per_key[key]
        prefixes[name] = triton_prefix(key)
    return {
        "repository": "server/triton",
        "max_batch": max_batch,
        "max_queue_delay_ms": server.max_queue_delay_ms if max_batch > 1 else 0.0,
        "instances": server.slots,
        "groups": per_group,
        "model_prefixes": prefixes,
        "unbatched": unbatched,
    }
