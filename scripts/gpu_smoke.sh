set -x
. scripts/gpu_env.sh
R=/tmp/runs; mkdir -p $R
nvidia-smi topo -m; nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
python3 -c "import torch;print(torch.__version__, torch.cuda.device_count(), torch.cuda.nccl.version())"
tk capture --device cuda --preset 7b --layers 2 --tokens 4 --tp 2 --mode cuda --out $R/smoke-tp2 --quiet
tk breakdown $R/smoke-tp2 | head -40
tk capture --device cuda --preset 7b --layers 2 --tokens 4 --tp 2 --nsys --out $R/smoke-tp2-nsys --quiet; ls -la $R/smoke-tp2-nsys
tk probe --op all_reduce --min 1K --max 64M --factor 8 --iters 5 --warmup 2 --ranks 2 --log-dir $R/nccl --no-progress
tk probe --op copy --min 256M --max 1G --factor 4 --no-progress
tar czf $OUT/smoke.tgz -C /tmp runs
