# The H200 campaign (issues 5, 8, 9), run through the device tool on nvidia-h200-x2:
#   bash scripts/gpu_campaign.sh captures   # dilation per mode + TP=1/2 captures (torch.profiler, nsys)
#   bash scripts/gpu_campaign.sh links      # NVLink vs P2P-disabled sweeps, copy probes, GPU tests
#   bash scripts/gpu_campaign.sh redo       # second pass: nsys captures, sweeps without per-call NCCL logging
# Everything lands under $OUT (runs.tgz etc.); NVLink multicast stays off (scripts/gpu_env.sh).
set -x
. scripts/gpu_env.sh
R=/tmp/runs; mkdir -p $R
W="--device cuda --preset 7b --layers 8"
stage=${1:-captures}
if [ "$stage" = captures ]; then
  nvidia-smi topo -m > $OUT/topo.txt 2>&1
  tk probe --op links >> $OUT/topo.txt 2>&1
  timeout 200 python3 benchmarks/bench_capture_modes.py $W --tokens 64 --out $OUT/modes.json 2>&1 | tee $OUT/modes.log | tail -30
  tk capture $W --tp 1 --tokens 32 --out $R/h200-tp1 --quiet
  tk capture $W --tp 2 --tokens 32 --out $R/h200-tp2 --quiet
  tk capture $W --tp 1 --tokens 32 --mode kernels --out $R/h200-tp1-kernels --quiet
  tk capture $W --tp 2 --tokens 32 --mode kernels --out $R/h200-tp2-kernels --quiet
  tk capture $W --tp 1 --tokens 16 --mode full --out $R/h200-tp1-full --quiet
  tk capture $W --tp 2 --tokens 16 --mode full --out $R/h200-tp2-full --quiet
  tk capture $W --tp 2 --tokens 16 --inject-delay 1:2 --out $R/h200-tp2-straggler --quiet
  tk capture $W --tp 1 --tokens 8 --nsys --out $R/h200-tp1-nsys --quiet
  tk capture $W --tp 2 --tokens 8 --nsys --out $R/h200-tp2-nsys --quiet
  for d in $R/h200-*; do echo "== $d"; python3 -c "import json,sys;m=json.load(open('$d/manifest.json'));print(m['workload']['mode'],m['dilation'],m['complete'])"; done
  tar czf $OUT/runs.tgz --exclude=.tracekit-cache -C /tmp runs
fi
if [ "$stage" = links ]; then
  tar xzf .dev/runs.tgz -C /tmp 2>/dev/null
  tk compare-links --gpus 0,1 --op all_reduce,all_gather --min 8 --max 1G --trace $R/h200-tp2 \
     --log-dir $R/nccl-logs -o $OUT/links.json --no-progress 2>&1 | tee $OUT/links.txt
  tk probe --op copy --min 64M --max 1G --factor 4 --no-progress -o $OUT/copy.json 2>&1 | tee $OUT/copy.txt
  tk probe --op copy --min 64M --max 1G --factor 4 --no-progress >> $OUT/copy.txt 2>&1
  timeout 240 python3 -m pytest -q -k "gpu or cuda" tests/test_capture.py tests/test_probe_sweep.py -p no:cacheprovider 2>&1 | tail -15 | tee $OUT/gpu-tests.txt
  tar czf $OUT/nccl-logs.tgz -C $R nccl-logs
fi
if [ "$stage" = redo ]; then
  tk capture $W --tp 1 --tokens 8 --nsys --out $R/h200-tp1-nsys --quiet
  tk capture $W --tp 2 --tokens 8 --nsys --out $R/h200-tp2-nsys --quiet
  tar czf $OUT/nsys-runs.tgz --exclude=.tracekit-cache --exclude='*.nsys-rep' -C $R h200-tp1-nsys h200-tp2-nsys
  tk compare-links --gpus 0,1 --op all_reduce,all_gather --min 8 --max 1G --trace traces/h200-tp2 \
     --baseline traces/h200-tp1 --log-dir $R/nccl-logs -o $OUT/links.json --no-progress 2>&1 | tee $OUT/links.txt
  tar czf $OUT/nccl-logs.tgz -C $R nccl-logs
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_probe_sweep.py tests/test_capture.py 2>&1 | tail -15 | tee $OUT/gpu-tests.txt
fi
