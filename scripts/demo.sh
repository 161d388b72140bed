#!/usr/bin/env bash
# README's first command: set up, then run the main job on a bundled example:
# build ResNet-18 from the zoo, profile it on this machine's two cores (big and a throttled
# little one), partition it for latency and for throughput, compile the bundles, run them and
# compare what was measured with what the plans predicted. It ends with what the product is for:
# a deploy that measures its plan against the best baselines on this machine (alternating runs)
# and ships the measured winner, with the verification table; last, a throughput plan over both
# cores, which measures faster than either core alone.
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
echo "== deploy: the latency plan, verified against the baselines by measurement on this machine"
$E deploy "$out/$model.onnx" --device host-biglittle --profile "$out/$model.profile.json" \
  --objective latency --verify-budget-s 30 -o "$out/deploy-bundle"
echo "== deploy: a throughput plan on both cores (host-2core), verified against each core alone"
$E deploy "$out/$model.onnx" --device host-2core --objective throughput --verify-budget-s 30 \
  -o "$out/deploy-throughput-bundle"
