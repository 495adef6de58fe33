#!/usr/bin/env bash
# Regenerate every committed report under reports/ from the committed traces (no GPU needed).
# Every HTML page is self-contained (plotly.js inlined, no --cdn): it opens offline.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${TRACEKIT_RECORD:-}" ]; then
  # scripts/pin_outputs.py: each command's arguments recorded (NUL-separated, a "\n" argument
  # ends a command), nothing run; it then runs them itself with the JSON outputs in a temp folder
  tk() { printf '%s\0' "$@" $'\n' >>"$TRACEKIT_RECORD"; }
else
  bash scripts/fetch_plotly_basic.sh  # the pages inline the basic plotly.js build (~1.3 MB a page)
  tk() { tracekit "$@" >/dev/null; }
fi
# the what-if documents first: the reports below include two of them (--extra)
P=reports/h200/links-graph.json
for f in markdown json; do
  ext=$([ $f = markdown ] && echo md || echo json)
  tk whatif --baseline traces/h200-tp1 --sharded traces/h200-tp2 --knob transfer=0 --knob launch=0 --knob sync=0 \
     --knob straggler=off --knob compute=/N --knob transfer=probe:$P --knob transfer=probe:$P@pcie \
     --knob launch=0,transfer=probe:$P --knob launch=0,transfer=probe:$P@pcie --format $f --out reports/whatif/h200-tp2.$ext
  tk whatif --baseline traces/cpu-tp1 --sharded traces/cpu-tp2-straggler --check traces/cpu-tp2 --check-knob straggler=off \
     --format $f --out reports/whatif/cpu-straggler.$ext
  tk whatif --baseline traces/h200-tp1-eager-whatif --knob launch=0 --knob sync=0 --check traces/h200-tp1-graphs \
     --check-knob launch=0 --format $f --out reports/whatif/h200-tp1-launch0.$ext
  # issue 26: a one-shot all-reduce (5 us + the probe's bandwidth) and the norm fused into the all-reduce
  tk whatif --baseline traces/h200x2-tp1-b1-graphs --sharded traces/h200x2-tp2-b1-graphs \
     --probe reports/multi-gpu/links-decode-sizes.json --knob collective_latency=5 --knob allreduce_norm=fused \
     --knob transfer=0 --format $f --out reports/whatif/h200x2-graphs-fused.$ext
done
tk report traces/cpu-tp2 --baseline traces/cpu-tp1 --title "tracekit CPU study: TP=1 vs TP=2 (tiny preset, gloo, committed traces)" \
   -o reports/cpu-study/report.html -o reports/cpu-study/report.md -o reports/cpu-study/report.json
tk report traces/cpu-tp2-straggler --baseline traces/cpu-tp1 --title "tracekit CPU study: TP=2 with a 20 ms straggler on rank 1 (tiny preset, gloo)" \
   --extra reports/whatif/cpu-straggler.json \
   -o reports/cpu-study/straggler.html -o reports/cpu-study/straggler.md -o reports/cpu-study/straggler.json
tk advise --tp1 traces/h200-tp1 --tpn traces/h200-tp2 --batch 16 --layers 32 --format json --out reports/advise/predicted-32-layers.json
tk advise --tp1 traces/h200-tp1 --tpn traces/h200-tp2 --batch 16 --layers 32 --out reports/advise/predicted-32-layers.txt
# sections from the other commands' committed JSON (--extra; whatif/diff/rho/decompose are made elsewhere)
tk report traces/h200-tp2 --baseline traces/h200-tp1 --links reports/h200/links-graph.json \
   --extra reports/whatif/h200-tp2.json --extra reports/advise/predicted-32-layers.json \
   --extra reports/rho/h200.json --extra reports/decompose/h200-graphs-compile.json \
   --title "2x H200 (NVLink): TP=1 vs TP=2, 7b shape (8 layers), NCCL, mode cuda" \
   -o reports/h200/report.html -o reports/h200/report.md -o reports/h200/report.json
tk report traces/h200-tp2-straggler --baseline traces/h200-tp1 --title "2x H200: TP=2 with a 2 ms host delay on rank 1 before every all-reduce" \
   --extra reports/diff/h200-tp2-straggler.json \
   -o reports/h200/straggler.html -o reports/h200/straggler.md -o reports/h200/straggler.json
tk report traces/h200-tp2-full --baseline traces/h200-tp1-full \
   --title "2x H200: TP=1 vs TP=2 captured in full mode (CPU+CUDA, every op): the profiler's dilation at its highest" \
   -o reports/h200/full-mode.html -o reports/h200/full-mode.md -o reports/h200/full-mode.json
tk report reports/h200-study/tp2 --baseline reports/h200-study/tp1 --links reports/h200-study/links.json \
   --title "tracekit study on 2x H200: TP=1 vs TP=2, 7b shape (8 layers), 16 tokens (a second, independent run)" \
   -o reports/h200-study/report.html -o reports/h200-study/report.md -o reports/h200-study/report.json
# the two-H200 pairs of scripts/gpu_multi.sh (reports/multi-gpu/README.md lists the commands)
L=reports/multi-gpu/links-decode-sizes.json
tk report traces/h200x2-tp2-b1-graphs --baseline traces/h200x2-tp1-b1-graphs --links $L \
   -o reports/multi-gpu/graphs-tp2.html -o reports/multi-gpu/graphs-tp2.md -o reports/multi-gpu/graphs-tp2.json
tk report traces/h200x2-tp2-b1-graphs-pcie --baseline traces/h200x2-tp1-b1-graphs --links $L -o reports/multi-gpu/graphs-tp2-pcie.md
tk report traces/h200x2-tp2-b1 --baseline traces/h200x2-tp1-b1 --links $L \
   -o reports/multi-gpu/eager-tp2.md -o reports/multi-gpu/eager-tp2.json
tk report traces/h200x2-tp2-b1-pcie --baseline traces/h200x2-tp1-b1 --links $L -o reports/multi-gpu/eager-tp2-pcie.md
# the roofline of the two-H200 CUDA-graph decode (the copy probe and rho measured on the same machine)
[ -n "${TRACEKIT_RECORD:-}" ] || mkdir -p reports/roofline
for r in h200x2-tp1-b1-graphs h200x2-tp2-b1-graphs; do
  tk roofline traces/$r --copy reports/h200/copy.json --rho reports/rho/h200.json --format json --out reports/roofline/$r.json
  tk roofline traces/$r --copy reports/h200/copy.json --rho reports/rho/h200.json --out reports/roofline/$r.txt
done
[ -n "${TRACEKIT_RECORD:-}" ] && exit 0
find traces reports -name .tracekit-cache -type d -prune -exec rm -rf {} +
echo "reports regenerated"
