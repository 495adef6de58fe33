# One device call per stage (device tool, nvidia-h200): bash scripts/gpu_session.sh STAGE
#   early: calibrated TP=1 captures (eager, CUDA graphs), rank-0 shards of TP=2/4/8 (issues 23, 26)
#   rho: tracekit rho (int8 with B column-major, FMA loop unrolled 32x, SM clock under load), then
#        int8 with a row-major B and the old 4x unroll beside it, nvidia-smi clocks logged (issue 26)
#   advise: batch 1, 16, 64 CUDA-graph decodes in one process, alternating rounds; advise fitted on
#        batch 1 predicts 16 and 64 (check.json); graph captures at 1/16/64 for the kernels (issue 26)
#   gemmsweep (ran at b4c034a; its outputs in reports/advise/gemmsweep/): the decoder's GEMMs (qkv, o, gate_up, down, LM head of the 7b shape,
#        TP=1, and one rank's shard at TP=2/4/8) timed alone at M = 1, 2, ..., 256 in CUDA graphs (the
#        tables `advise --gemm-table` reads);
#        batch 1, 16, 64, 128, 256 CUDA-graph decodes in one process, alternating rounds; traced graph
#        captures at 1 and 16; then advise given batch 1 + the table, batch 1 + 16 traced, and both,
#        predicts the other batches (benchmarks/advise_batches.py check; ~5 min)
#   batchtraces (ran at ed082b4; its outputs in reports/advise/batchtraces/): traced CUDA-graph captures at batch 64, 128, 256 (the 7b shape,
#        8 layers), then the committed gemmsweep checks with them beside the predictions (--compare):
#        the per-kind split of what the b1 + table model misses at 128/256 (issue 26; ~2.5 min)
#   ab: the reference decoder legacy vs fused (issue 26): one process, alternating rounds, CUDA graphs
#       and eager (scripts/decoder_ab.py); a traced graph capture of each and its roofline (~4 min)
#   check: legacy vs fused on the GPU, teacher-forced, float32 and bfloat16 (scripts/decoder_check.py; ~2 min)
#   causes: the A/B of each cause, CUDA graphs: fused against fused with one legacy cause put back
#       (norm, rope, gqa, mask; scripts/decoder_ab.py, one process, alternating rounds; ~2 min)
#   multi: on a machine of K >= 2 GPUs (nvidia-h200-x2 / -x4): the check of the shard prediction. A
#       graph-timed probe at K ranks, a real TP=K CUDA-graph capture and the shard of TP=K on the same host,
#       `tracekit predict --check` with the K-rank probe and with the committed 2-rank one (~5 min)
#   shards: rank-0 shards of TP=2/4/8 with the fused decoder (CUDA graphs), their roofline, and
#       `tracekit predict` of TP=2/4/8 with the two-H200 graph-timed NVLink probe (~4 min)
#   dask: benchmarks/bench_scale.py, 64 synthetic ranks calibrated local + 8/1/16/8/1 workers with the
#       task stream, 256 calibrated on 16; with BEFORE=DIR its 8/1/8 workers alternated with this
#       tree's; the client's share and peak RSS (issue 27; ~8 min at most)
#   dask-check: dask without the task stream and with one 1-worker case, BEFORE's 8 workers
#       alternated with this tree's twice: a refactor's same-speed check (issue 27; ~7 min at most);
#       ALT="before:8 after:8 ..." (side:workers, in order) sets the alternation of either stage
#   dask-ab: BEFORE=DIR against this tree and this tree with numpy's huge pages off, 64 calibrated
#       ranks, 8 / 1 / 8 workers alternated, task streams (issue 27; ~6 min)
#   compile: torch.compile's default backend (inductor) on the decoder's static step, CPU and CUDA:
#       the same greedy tokens as eager (scripts/compile_check.py; the suite checks aot_eager, ~2 min)
#   decompose: the committed CPU set `decompose` (scripts/capture_cpu_test_traces.py decompose: three
#       TP=2 gloo captures that must run at one host speed, which the loaded 2-core dev VM never holds;
#       this host's 16 cores are quiet), returned as decompose-traces.tgz to commit under traces/ (~1 min)
#   suitecap: compile, then decompose (issue 24's two stages in one call)
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
if [ "$stage" = ab ]; then
  A="--device cuda --preset 7b --layers 8 --tokens 32 --rounds 9"
  python3 scripts/decoder_ab.py $A --graphs -o $OUT/ab-graphs.json 2>&1 | tee $OUT/ab.txt
  python3 scripts/decoder_ab.py $A -o $OUT/ab-eager.json 2>&1 | tee -a $OUT/ab.txt
  PK="--copy reports/h200/copy.json --rho reports/rho/h200.json"
  for impl in legacy fused; do
    d=$R/h200-tp1-graphs-$impl
    tk capture $W --tp 1 --tokens 32 --cuda-graphs --decoder-impl $impl -o $d --quiet
    tk roofline $d $PK --out $d/roofline.txt
    tk roofline $d $PK --format json --out $d/roofline.json
    cat $d/roofline.txt >> $OUT/ab.txt
  done
  tar czf $OUT/ab-runs.tgz --exclude=.tracekit-cache -C /tmp runs
fi
if [ "$stage" = shards ]; then
  PK="--copy reports/h200/copy.json --rho reports/rho/h200.json"
  S=""
  for n in 2 4 8; do
    d=$R/h200-shard$n-graphs-fused
    tk capture $W --tokens 32 --cuda-graphs --shard-of $n --decoder-impl fused -o $d --quiet
    tk roofline $d $PK --out $d/roofline.txt
    S="$S --shard $d"
  done
  tk predict $S --link reports/h200/links-graph.json@nvlink | tee $OUT/predict.txt
  tk predict $S --link reports/h200/links-graph.json@nvlink --format json -o $OUT/predict.json
  tar czf $OUT/shards-runs.tgz --exclude=.tracekit-cache -C /tmp runs
fi
if [ "$stage" = check ]; then
  python3 scripts/decoder_check.py --device cuda --preset 7b --layers 8 --tokens 32 -o $OUT/check.json 2>&1 | tee $OUT/check.txt
  python3 scripts/decoder_check.py --device cuda --preset 7b --layers 1 --tokens 32 -o $OUT/check-1layer.json 2>&1 | tee -a $OUT/check.txt
fi
if [ "$stage" = causes ]; then
  python3 scripts/decoder_ab.py --device cuda --preset 7b --layers 8 --tokens 32 --rounds 9 --graphs \
    --impls fused,legacy,fused-norm,fused-rope,fused-gqa,fused-mask,fused-norm-rope-gqa-mask \
    -o $OUT/causes-graphs.json 2>&1 | tee $OUT/causes.txt
fi
if [ "$stage" = multi ]; then
  K=$(python3 -c 'import torch; print(torch.cuda.device_count())')
  [ "$K" -ge 2 ] || { echo "multi needs at least 2 GPUs, found $K"; exit 2; }
  tk probe --op all_reduce,all_gather --min 4K --max 512K --graph --ranks $K -o $OUT/probe-graph-$K.json
  real=$R/h200x$K-tp$K-graphs-fused; shard=$R/h200x$K-shard$K-graphs-fused
  tk capture $W --tp $K --tokens 32 --cuda-graphs -o $real --quiet
  tk capture $W --tp 1 --tokens 32 --cuda-graphs --shard-of $K -o $shard --quiet
  tk predict --shard $shard --link $OUT/probe-graph-$K.json --check $real | tee $OUT/multi.txt
  tk predict --shard $shard --link reports/h200/links-graph.json@nvlink --check $real | tee -a $OUT/multi.txt
  tk predict --shard $shard --link $OUT/probe-graph-$K.json --check $real --format json -o $OUT/multi-predict.json
  tar czf $OUT/multi-runs.tgz --exclude=.tracekit-cache -C /tmp runs
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
if [ "$stage" = gemmsweep ]; then  # ~5 min
  G=$R/gemmsweep; mkdir -p $G
  P="--copy reports/h200/copy.json --rho reports/rho/h200.json"
  timeout 120 python3 benchmarks/advise_batches.py gemmsweep --device cuda --preset 7b --layers 8 --tp 1 --m-max 256 -o $OUT/gemm-table-h200.json
  for n in 2 4 8; do timeout 60 python3 benchmarks/advise_batches.py gemmsweep --device cuda --preset 7b --layers 8 --tp $n --m-max 256 -o $OUT/gemm-table-h200-tp$n.json; done
  timeout 240 python3 benchmarks/advise_batches.py --device cuda --preset 7b --layers 8 --cuda-graphs --batches 1,16,64,128,256 --tokens 32 --rounds 5 -o $G/batches
  for b in 1 16; do timeout 100 python3 -m tracekit.cli.main capture $W --tp 1 --tokens 32 --rounds 3 --cuda-graphs --batch $b -o $G/graphs-b$b --quiet; done
  python3 benchmarks/advise_batches.py check $G/batches --fit 1 --kernels $G/graphs-b1 --gemm-table $OUT/gemm-table-h200.json $P -o $OUT/check-b1-table.json
  python3 benchmarks/advise_batches.py check $G/batches --fit 1 --kernels $G/graphs-b1 --kernels $G/graphs-b16 $P -o $OUT/check-b1-b16.json
  python3 benchmarks/advise_batches.py check $G/batches --fit 1 --kernels $G/graphs-b1 --kernels $G/graphs-b16 --gemm-table $OUT/gemm-table-h200.json $P -o $OUT/check-b1-b16-table.json
  tar czf $OUT/gemmsweep-runs.tgz --exclude=.tracekit-cache -C $R gemmsweep
fi
if [ "$stage" = batchtraces ]; then  # ~2.5 min
  G=$R/batchtraces; mkdir -p $G; S=reports/advise/gemmsweep
  P="--copy reports/h200/copy.json --rho reports/rho/h200.json"
  for b in 64 128 256; do timeout 100 python3 -m tracekit.cli.main capture $W --tp 1 --tokens 32 --rounds 3 --cuda-graphs --batch $b -o $G/graphs-b$b --quiet; done
  C="--compare $G/graphs-b64 --compare $G/graphs-b128 --compare $G/graphs-b256"
  python3 benchmarks/advise_batches.py check $S/batches --fit 1 --kernels $S/graphs-b1 --gemm-table $S/gemm-table-h200.json $P $C -o $OUT/check-b1-table-compare.json
  python3 benchmarks/advise_batches.py check $S/batches --fit 1 --kernels $S/graphs-b1 --kernels $S/graphs-b16 --kernels $G/graphs-b64 $P --compare $G/graphs-b128 --compare $G/graphs-b256 -o $OUT/check-b1-b16-b64-compare.json
  tar czf $OUT/batchtraces-runs.tgz --exclude=.tracekit-cache -C $R batchtraces
fi
# dask (issue 27): the Dask executor on 64 synthetic ranks of traces/h200-tp2 (1.3 GB of JSON).
# (1) the run with a profiler_calibration in its manifest (bench_scale --calibrated: the cost per call
# removed, nothing solved): the local engine, then LocalClusters of 8, 1, 16, 8 and 1 workers (8 vs
# 1 is the shape check; 8 and 1 twice: the host drifts 10-15% between calls), with the Dask task
# stream (`--stream`: where the wall goes); (2) 256 calibrated ranks (5.2 GB) on 16 workers, for the
# client's share and peak RSS; (3) with BEFORE=DIR (an absolute path: `git archive OLD tracekit
# benchmarks | tar -x -C .dev/before`, carried): its 8 / 1 / 8 workers alternated with this tree's,
# one case per invocation, for a before/after on one host.
# The run without a calibration (the cost solved and checked for identifiability, one task per rank:
# plans.Fan) was measured in an earlier call (`--ranks 64 --workers 16`, ~80 s). Inner timeouts per
# case and per part (a case's JSON row is printed as it ends): ~8 min at most; tables and per-case
# JSON rows under $OUT.
if [ "$stage" = dask ] || [ "$stage" = dask-check ]; then
  nproc; free -g | head -2
  B="python3 benchmarks/bench_scale.py --what shortfall --workdir /tmp/bench-scale"
  if [ "$stage" = dask ]; then
    W64=8,1,16,8,1; S64="--stream"; T64=260; C64=100; T256=120; TA=100; CA=90
    ALT=${ALT:-"after:8 before:8 after:1 before:1 after:8 before:8"}
  else  # dask-check: no stream, one 1-worker case, 8 workers alternated (ALT: another order)
    W64=8,1,16,8; S64=""; T64=200; C64=80; T256=110; TA=60; CA=50
    ALT=${ALT:-"after:8 before:8 after:8 before:8"}
  fi
  # T / C: outer and per-case seconds (64 ranks, 256 ranks, an alternated case A)
  timeout $T64 $B --ranks 64 --calibrated --workers $W64 --local $S64 --case-timeout $C64 \
    --out $OUT/dask-scale64-cal.json 2>&1 | tee $OUT/dask-scale64-cal.txt | grep -v '^{"case"'
  timeout $T256 $B --ranks 256 --calibrated --workers 16 --case-timeout 100 \
    --out $OUT/dask-scale256-cal.json 2>&1 | tee $OUT/dask-scale256-cal.txt | grep -v '^{"case"'
  if [ -n "${BEFORE:-}" ]; then
    # before and after alternated, one case per invocation (the host drifts within a call too);
    # BEFORE is a copy of the older tree's tracekit/ and benchmarks/: its traces are this tree's
    mkdir -p "$BEFORE/traces"
    for t in h200-tp1 h200-tp1-calibrated h200-tp2; do ln -sfn "$PWD/traces/$t" "$BEFORE/traces/$t"; done
    one() {  # $1 after|before, $2 workers, $3 index
      if [ "$1" = after ]; then d=$PWD; else d=$BEFORE; fi
      (cd "$d" && PYTHONPATH=/tmp/site:$d timeout $TA $B --ranks 64 --calibrated --workers "$2" --case-timeout $CA \
        --out "$OUT/alt-$3-$1-w$2.json" 2>&1 | grep "^| dask" | sed "s/^/$3 $1 /")
    }
    i=0
    for c in $ALT; do i=$((i+1)); one "${c%%:*}" "${c##*:}" $i; done
  fi
fi
if [ "$stage" = dask-ab ]; then
  # BEFORE (an older tree's tracekit/ and benchmarks/) against this tree, and this tree with numpy's
  # transparent huge pages off in every process (NUMPY_MADVISE_HUGEPAGE=0; the workers inherit it):
  # 64 calibrated ranks, 8 / 1 / 8 workers, the three alternated one case per invocation
  nproc; free -g | head -2; grep -H . /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag
  B="python3 benchmarks/bench_scale.py --what shortfall --workdir /tmp/bench-scale"
  timeout 120 $B --ranks 64 --calibrated --workers "" --local --out $OUT/ab-local.json 2>&1 | grep -v '^{"case"'
  mkdir -p "$BEFORE/traces"
  for t in h200-tp1 h200-tp1-calibrated h200-tp2; do ln -sfn "$PWD/traces/$t" "$BEFORE/traces/$t"; done
  one() {  # $1 after|before|nohuge, $2 workers, $3 index
    d=$PWD; hp=1
    if [ "$1" = before ]; then d=$BEFORE; fi
    if [ "$1" = nohuge ]; then hp=0; fi
    (cd "$d" && NUMPY_MADVISE_HUGEPAGE=$hp PYTHONPATH=/tmp/site:$d timeout 100 $B --ranks 64 --calibrated --workers "$2" \
      --case-timeout 90 --stream --out "$OUT/ab-$3-$1-w$2.json" > "$OUT/ab-$3-$1-w$2.txt" 2>&1;
      grep "^| dask" "$OUT/ab-$3-$1-w$2.txt" | sed "s/^/$3 $1 /")
  }
  i=0
  for w in 8 1 8; do for v in after before nohuge; do i=$((i+1)); one $v $w $i; done; done
fi
if [ "$stage" = compile ] || [ "$stage" = suitecap ]; then
  nproc
  timeout 300 python3 scripts/compile_check.py 2>&1 | tee $OUT/compile.txt
fi
if [ "$stage" = decompose ] || [ "$stage" = suitecap ]; then
  timeout 240 python3 scripts/capture_cpu_test_traces.py decompose 2>&1 | tee $OUT/decompose.txt
  tar czf $OUT/decompose-traces.tgz --exclude=.tracekit-cache traces/cpu-decompose-* traces/cpu-decompose-probes.json
fi
