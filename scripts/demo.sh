#!/usr/bin/env bash
# README's first command: set up, then run the main job on a bundled example:
# build ResNet-18 from the zoo, profile it on this machine's two cores (big and a throttled
# little one), partition it, compile the bundle, run it and compare with the prediction.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${EDGESPLIT_DEMO_DIR:-out/demo}
mkdir -p "$out"
E=.venv/bin/edgesplit
model=${EDGESPLIT_DEMO_MODEL:-resnet18}
$E zoo "$model" -o "$out/$model.onnx"
$E profile "$out/$model.onnx" --device host-biglittle --backend ort --runs 20 -o "$out/$model.profile.json"
$E partition "$out/$model.onnx" --device host-biglittle --profile "$out/$model.profile.json" \
  --objective latency --plot "$out/plan.png" -o "$out/plan.json"
$E compile "$out/$model.onnx" --plan "$out/plan.json" -o "$out/bundle"
$E run "$out/bundle" --repeat 50 --stream 50
