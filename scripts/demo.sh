#!/usr/bin/env bash
# README's first command: set up, then run the main job on a bundled example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${EDGESPLIT_DEMO_DIR:-out/demo}
mkdir -p "$out"
E=.venv/bin/edgesplit
$E zoo resnet18 -o "$out/resnet18.onnx"
$E profile "$out/resnet18.onnx" --device host --runs 20 -o "$out/resnet18.host.profile.json"
