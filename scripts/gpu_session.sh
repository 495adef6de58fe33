# One device call per stage (device tool, nvidia-h200): bash scripts/gpu_session.sh STAGE
#   early: calibrated TP=1 captures (eager, CUDA graphs), rank-0 shards of TP=2/4/8 (issues 23, 26)
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
