#!/usr/bin/env bash
# README's first command: set up, then run the main job on a bundled example:
# build ResNet-18 from the zoo, profile it on this machine's two cores (big and a throttled
# little one), partition it for latency and for throughput, compile the bundles, run them and
# compare what was measured with what the plans predicted. It ends with what the product is for:
# a deploy that measures its plan against the baselines a user would pick instead (plain ONNX
# Runtime over every core, ORT's own assignment, each processor alone) in alternating runs and
# ships the measured winner, with the verification table (here with operators split between the
# big and the little core, which must beat ORT on the big core to ship); last, a stream over both
# cores, against plain ORT back to back and a whole-model replica per core.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${EDGESPLIT_DEMO_DIR:-out/demo}
mkdir -p "$out"
E=.venv/bin/edgesplit
model=${EDGESPLIT_DEMO_MODEL:-resnet18}
$E zoo "$model" -o "$out/$model.onnx"
$E profile "$out/$model.onnx" --device host-biglittle --backend ort --runs 20 -o "$out/$model.profile.json"
for objective in latency throughput; do
  echo "== objective: $objective"
  $E partition "$out/$model.onnx" --device host-biglittle --profile "$out/$model.profile.json" \
    --objective "$objective" --plot "$out/$objective.png" -o "$out/$objective.json"
  $E compile "$out/$model.onnx" --plan "$out/$objective.json" -o "$out/$objective-bundle"
  $E run "$out/$objective-bundle" --repeat 30 --stream 100
done
echo "== deploy: the latency plan (operators split across big and little), verified against plain ORT and the rest"
$E deploy "$out/$model.onnx" --device host-biglittle --profile "$out/$model.profile.json" \
  --objective latency --split-operators --verify-budget-s 30 -o "$out/deploy-bundle"
echo "== deploy: a stream on both cores (host-2core), verified against plain ORT and replicas"
$E deploy "$out/$model.onnx" --device host-2core --objective throughput --verify-budget-s 30 \
  -o "$out/deploy-throughput-bundle"
