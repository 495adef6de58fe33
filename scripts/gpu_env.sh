# Source on the GPU machine (device tool): tracekit from the working tree, carried wheels, nsys libs.
# NVLink multicast stays off (never change it: it can take the host's shared GPUs down).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/dw && for f in .dev/debs/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export NSYS=/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys
tk() { python3 -m tracekit.cli.main "$@"; }
