#!/usr/bin/env bash
# Issue 14 (second multi-GPU campaign), one call on nvidia-h200-x2 through the device tool:
#   run(command="bash scripts/gpu_multi.sh", kind="nvidia-h200-x2", carry=[".dev"])
# The most important runs come first (the call may be cut short by the session's device time):
#   1. batch 1: TP=1/TP=2 eager and --cuda-graphs, TP=2 both again with NCCL_P2P_DISABLE=1 -> b1.tgz
#   2. compare-links at the decode's sizes (bf16 all_reduce, CUDA-graph timing)       -> links.json
#   3. batch 16: TP=1/TP=2 eager and --cuda-graphs                                     -> b16.tgz
#   4. batch 1 repeated twice more (spread of the host's speed)                        -> rep2.tgz, rep3.tgz
# Traces are analysed here afterwards (no GPU needed). NVLink multicast stays off (gpu_env.sh).
set -u
. scripts/gpu_env.sh
LOG=$OUT/log.txt
exec > >(tee -a "$LOG") 2>&1
date -u +%FT%TZ
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
python3 -c 'import torch; print(torch.__version__, torch.cuda.device_count(), torch.cuda.get_device_name(0))'
W="--device cuda --preset 7b --layers 8 --tokens 32 --rounds 3 --quiet"
R=/tmp/runs
cap() {  # cap NAME [env ...] -- [capture flags]
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local t0=$SECONDS
  env "${envs[@]}" timeout 120 python3 -m tracekit.cli.main capture $W "$@" --out "$R/$name" >/tmp/cap.log 2>&1
  local rc=$?
  if [ $rc -ne 0 ] && [[ " $* " == *" --cuda-graphs "* ]]; then  # CUPTI teardown under graphs (seen on one H200)
    echo "retry $name with TEARDOWN_CUPTI=0 after rc $rc"; grep -v USDT /tmp/cap.log | tail -4
    rm -rf "${R:?}/$name"
    env "${envs[@]}" TEARDOWN_CUPTI=0 timeout 120 python3 -m tracekit.cli.main capture $W "$@" --out "$R/$name" >/tmp/cap.log 2>&1
    rc=$?
  fi
  echo "== $name rc=$rc $((SECONDS - t0))s"; grep -v USDT /tmp/cap.log | tail -3
  rm -rf "$R/$name/.tracekit-cache"
}
pack() {  # pack FILE RUN...
  local f=$1; shift
  (cd $R && tar czf "$OUT/$f.tmp" "$@" 2>/dev/null) && mv "$OUT/$f.tmp" "$OUT/$f"
}
P2P="NCCL_P2P_DISABLE=1"
batch1() {  # batch1 SUFFIX
  local s=$1 b1=()
  cap "tp1-b1$s" X=1 -- --tp 1
  cap "tp2-b1$s" X=1 -- --tp 2
  cap "tp1-b1-graphs$s" X=1 -- --tp 1 --cuda-graphs
  cap "tp2-b1-graphs$s" X=1 -- --tp 2 --cuda-graphs
  cap "tp2-b1-pcie$s" $P2P -- --tp 2
  cap "tp2-b1-graphs-pcie$s" $P2P -- --tp 2 --cuda-graphs
}
mkdir -p $R
batch1 ""
pack b1.tgz tp1-b1 tp2-b1 tp1-b1-graphs tp2-b1-graphs tp2-b1-pcie tp2-b1-graphs-pcie
t0=$SECONDS
timeout 100 python3 -m tracekit.cli.main compare-links --gpus 0,1 --op all_reduce --dtype bfloat16 \
  --min 1K --max 16M --factor 4 --graph --no-algo-pass --no-progress -o "$OUT/links.json" 2>&1 | grep -v USDT | tail -25
echo "== links $((SECONDS - t0))s"
for v in tp1 tp2; do
  cap "$v-b16" X=1 -- --tp ${v#tp} --batch 16
  cap "$v-b16-graphs" X=1 -- --tp ${v#tp} --batch 16 --cuda-graphs
done
pack b16.tgz tp1-b16 tp2-b16 tp1-b16-graphs tp2-b16-graphs
for rep in 2 3; do
  batch1 "-r$rep"
  pack rep$rep.tgz tp1-b1-r$rep tp2-b1-r$rep tp1-b1-graphs-r$rep tp2-b1-graphs-r$rep tp2-b1-pcie-r$rep tp2-b1-graphs-pcie-r$rep
done
date -u +%FT%TZ
ls -la "$OUT"
