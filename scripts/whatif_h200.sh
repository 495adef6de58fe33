#!/usr/bin/env bash
# Issue 13's H200 check (device tool, one H200): the eager TP=1 7b-shaped capture, the same
# workload as one CUDA-graph replay per token, then (if time allows) torch.compile inside the graph.
# The prediction (`tracekit whatif ... --knob launch=0 --check ... --check-knob launch=0`) is made
# from the eager capture alone; the graphs capture is only the measurement it is held to.
set -u
. scripts/gpu_env.sh
python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0))'
mkdir -p /tmp/runs
common="--device cuda --preset 7b --layers 8 --tp 1 --tokens 32 --quiet"
cap() { tk capture $common "$@" >/tmp/cap.log 2>&1; rc=$?; grep -v USDT /tmp/cap.log | tail -8; return $rc; }
cap --out /tmp/runs/h200-tp1-eager-whatif
cap --cuda-graphs --out /tmp/runs/h200-tp1-graphs || TEARDOWN_CUPTI=0 cap --cuda-graphs --out /tmp/runs/h200-tp1-graphs
rm -rf /tmp/runs/*/.tracekit-cache
tar czf "$OUT/runs.tgz" -C /tmp/runs h200-tp1-eager-whatif h200-tp1-graphs
tk whatif --baseline /tmp/runs/h200-tp1-eager-whatif --knob launch=0 --knob sync=0 \
  --check /tmp/runs/h200-tp1-graphs --check-knob launch=0 --no-cache 2>&1 | tee "$OUT/whatif.txt"
timeout 150 bash -c ". scripts/gpu_env.sh; tk capture $common --cuda-graphs --compile --rounds 2 \
  --out /tmp/runs/h200-tp1-graphs-compile" >/tmp/cap.log 2>&1; grep -v USDT /tmp/cap.log | tail -5
if [ -f /tmp/runs/h200-tp1-graphs-compile/manifest.json ]; then
  rm -rf /tmp/runs/*/.tracekit-cache
  tar czf "$OUT/compile.tgz" -C /tmp/runs h200-tp1-graphs-compile
fi
ls -la "$OUT"
