# One device call per stage (device tool, nvidia-h200): bash scripts/gpu_session.sh STAGE
#   early: calibrated TP=1 captures (eager, CUDA graphs), rank-0 shards of TP=2/4/8 (issues 23, 26)
#   rho: tracekit rho (int8 with B column-major, FMA loop unrolled 32x, SM clock under load), then
#        int8 with a row-major B and the old 4x unroll beside it, nvidia-smi clocks logged (issue 26)
#   advise: batch 1, 16, 64 CUDA-graph decodes in one process, alternating rounds; advise fitted on
#        batch 1 predicts 16 and 64 (check.json); graph captures at 1/16/64 for the kernels (issue 26)
# Everything lands under $OUT; NVLink multicast stays off (scripts/gpu_env.sh).
set -x
. scripts/gpu_env.sh
R=/tmp/runs; mkdir -p $R
W="--device cuda --preset 7b --layers 8"
stage=${1:-early}
python3 -c 'import torch,sys;print(sys.version, torch.__version__, torch.cuda.get_device_name(0))'
if [ "$stage" = early ]; then
  tk capture $W --tp 1 --tokens 32 -o $R/h200-tp1-calibrated --quiet
  tk capture $W --tp 1 --tokens 32 --cuda-graphs -o $R/h200-tp1-graphs-calibrated --quiet
  for n in 2 4 8; do tk capture $W --tokens 32 --cuda-graphs --shard-of $n -o $R/h200-shard$n-graphs --quiet; done
  for d in $R/*; do echo "== $d"; python3 -c "import json;m=json.load(open('$d/manifest.json'));print(m['workload'].get('shard_of'),m['unprofiled'],m['dilation'],m.get('profiler_calibration',{}).get('per_call_ns'))"; done
  tar czf $OUT/early-runs.tgz --exclude=.tracekit-cache -C /tmp runs
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tail -15 | tee $OUT/gpu-tests.txt
fi
if [ "$stage" = rho ]; then  # ~1 min
  D=/tmp/rho; mkdir -p $D
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 250 > $D/clocks.csv 2>&1 &
  SMI=$!
  timeout 150 python3 -m tracekit.cli.main rho --json $D/h200.json -o $D/h200.txt
  timeout 90 python3 -m tracekit.cli.main rho --matrix int8,int8-rowb --vector fp32 --fma-unroll 4 --json $D/h200-rowb-unroll4.json -o $D/h200-rowb-unroll4.txt
  kill $SMI
  cat $D/h200.txt $D/h200-rowb-unroll4.txt
  tar czf $OUT/rho.tgz -C /tmp rho
fi
if [ "$stage" = advise ]; then  # ~3 min
  A=$R/advise
  timeout 200 python3 benchmarks/advise_batches.py --device cuda --preset 7b --layers 8 --cuda-graphs --batches 1,16,64 --tokens 32 --rounds 7 -o $A
  python3 benchmarks/advise_batches.py check $A --fit 1 -o $A/check.json
  for b in 1 16 64; do timeout 100 python3 -m tracekit.cli.main capture $W --tp 1 --tokens 32 --rounds 3 --cuda-graphs --batch $b -o $R/advise-graphs-b$b --quiet; done
  tar czf $OUT/advise-runs.tgz --exclude=.tracekit-cache -C /tmp runs
fi
# dask (issue 27): the Dask executor on 64 synthetic ranks of traces/h200-tp2 (1.3 GB of JSON):
# the local engine, then LocalClusters of 16, 8, 1 and 4 workers; then 256 ranks (5.2 GB) on 16
# workers for the client's peak memory. Under 8 min together; tables and per-case JSON rows under $OUT.
if [ "$stage" = dask ]; then
  nproc; free -g | head -2
  timeout 320 python3 benchmarks/bench_scale.py --ranks 64 --workers 16,8,1,4 --local --what shortfall \
    --workdir /tmp/bench-scale --out $OUT/dask-scale64.json 2>&1 | tee $OUT/dask-scale64.txt
  timeout 150 python3 benchmarks/bench_scale.py --ranks 256 --workers 16 --what shortfall \
    --workdir /tmp/bench-scale --out $OUT/dask-scale256.json 2>&1 | tee $OUT/dask-scale256.txt
fi
