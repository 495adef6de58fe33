"""The ordered rule table of the classifier (docs/METHOD.md section Classes).

Each event gets exactly one class from the FIRST rule that applies to its kind and whose regex
matches (``re.search``) its name without the parameter list (`strip_parameters`). Order matters and is tested: a name containing "reduce" is not
thereby a collective (``paged_attention_ll4mi_reduce_kernel`` is attention, ``reduce_kernel`` is a
vector reduction), so collective rules match library prefixes, never the bare word.

GPU activity (kinds kernel, memcpy, memset) gets compute / memory / collective. A kernel that
matches no communication, memory or sync rule is compute, subclass ``other`` (rule
``other_kernel``): a Triton MoE-routing kernel or a project's own CUDA kernel runs on the SMs like
any other compute, which is how every other tool counts it. ``unknown`` is kept for kernels whose
names look like communication (``allreduce``, ``all_gather``, ``reduce_scatter``, ``multimem``,
``symm``, ``one_shot``, ``two_shot``, ``cross_device``, ``nvls``, ``a2a``, MoE ``dispatch`` /
``combine``...) but match no collective rule (rules ``comm_like_name``, ``comm_like_moe``): they are
reported with count, time and `COMM_LIKE_HINT`, never silently put into compute. Host events get ``sync`` (a call that blocks the host on the device), ``collective``
(gloo / c10d CPU ops, ProcessGroup annotations) or ``host`` (everything else on the host).

Naming conventions behind the collective rules:
- NCCL: ``ncclKernel_<Coll>_<ALGO>_<PROTO>_<RedOp>_<type>`` (NCCL 2.x up to 2.18, e.g.
  ``ncclKernel_AllReduce_RING_LL_Sum_float``), ``ncclDevKernel_<...>`` (2.19+, e.g.
  ``ncclDevKernel_Generic_4``, ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``), the symmetric kernels
  ``ncclSymkDevKernel_*`` / ``ncclSymDevKernel_*`` (2.27+), and NCCL 1.x / 2.0-era names such as
  ``ncclAllReduceRingLLKernel_sum_f32``; all are ``nccl...Kernel...``.
- RCCL (ROCm) keeps the NCCL kernel names (``ncclDevKernel_Generic``), so on AMD traces these count
  as subclass ``nccl`` too; RCCL-specific names (``rccl*``, MSCCL ``mscclKernel_*``) get ``rccl``.
- Custom all-reduce: vLLM / SGLang ``cross_device_reduce_1stage|2stage``, PyTorch symmetric memory
  ``multimem_all_reduce``, ``one_shot_all_reduce``, ``two_shot_all_reduce``, TensorRT-LLM /
  FlashInfer ``allreduce_fusion_kernel_*``, ``oneShotAllReduceKernel``, ``twoShotAllReduceKernel``,
  Lamport-buffer kernels, vLLM ROCm quick all-reduce.
  Sources (public code, read through the `search` tool): vLLM ``csrc/custom_all_reduce.cuh``
  (``cross_device_reduce_1stage/2stage``), ``csrc/quickreduce`` / aiter (``quickreduce::allreduce_prototype_twoshot``,
  ``aiter::cross_device_reduce_2stage``), sgl-kernel (``sglang::cross_device_reduce_*``, trt_reduce's
  ``oneShotAllReduceKernel``), TensorRT-LLM ``cpp/tensorrt_llm/kernels/customAllReduceKernels.cu``
  (``oneShotAllReduceKernel``, ``twoShotAllReduceKernel``), ``communicationKernels/allReduceFusionKernels.cu``
  (``allreduce_fusion_kernel_oneshot_lamport``, ``allreduce_fusion_kernel_twoshot_sync``),
  ``communicationKernels/mnnvlTwoShotAllreduceKernels.cu`` and FlashInfer ``trtllm_mnnvl_allreduce``
  (``oneshotAllreduceFusionKernel``, ``twoshotAllreduceKernel``, ``rmsNormLamport``),
  ``communicationKernels/moeAlltoAllKernels.cu`` (``moeA2ADispatchKernel``, ``moeA2ACombineKernel``,
  ``moeA2APrepareDispatchKernel``), DeepEP (``deep_ep::intranode::dispatch``, ``deep_ep::internode_ll::combine``),
  pplx-kernels (``pplx::dispatchKernel``), PyTorch symmetric memory ``torch/csrc/distributed/c10d/symm_mem``
  (``multimem_all_reduce_kernel``, ``one_shot_all_reduce_kernel``, ``two_shot_all_reduce_kernel_inplace``,
  NVSHMEM ``allToAllV``, ``allToAllV_2d``, ``exchangeSplitAndOffset``), MSCCL++ (``mscclpp``), NVSHMEM (``nvshmem*``).
- gloo: ProcessGroupGloo records ``gloo:<op>`` ranges (e.g. ``gloo:all_reduce``) on its worker
  threads; the calling thread records ``c10d::allreduce_`` and friends as CPU ops (captured with
  torch 2.13, see tests/gloo_capture.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Kinds of GPU activity (the device timeline).
GPU_KINDS: frozenset[str] = frozenset({"kernel", "memcpy", "memset"})
#: Kinds of host-side events.
HOST_KINDS: frozenset[str] = frozenset({"runtime", "sync", "cpu_op", "annotation", "other"})

#: Classes, in the priority order of the partition (unknown before sync; host never enters it).
CLASSES: tuple[str, ...] = ("compute", "memory", "collective", "unknown", "sync", "host")

_KERNEL = frozenset({"kernel"})
_HOST_CALLS = frozenset({"runtime", "sync"})
_HOST_OPS = frozenset({"cpu_op", "annotation", "other"})


@dataclass(frozen=True)
class Rule:
    """One row of the rule table."""

    name: str  # stable id, shown in the `rule` column and by --explain
    kinds: frozenset[str]  # event kinds the rule applies to
    pattern: re.Pattern[str]  # searched in the event name
    cls: str  # one of CLASSES
    subclass: str  # finer class (matrix, vector, memcpy, nccl, gloo, stream_sync, ...)
    comment: str  # why, with an example name


def _r(
    name: str, kinds: frozenset[str], regex: str, cls: str, subclass: str, comment: str, flags: int = 0
) -> Rule:
    return Rule(name, kinds, re.compile(regex, flags), cls, subclass, comment)


_I = re.IGNORECASE

RULES: tuple[Rule, ...] = (
    # ---------------------------------------------------------------- GPU: memory
    _r(
        "memcpy",
        frozenset({"memcpy"}),
        r"",
        "memory",
        "memcpy",
        "every memcpy activity, e.g. 'Memcpy DtoD (Device -> Device)'",
    ),
    _r(
        "memset",
        frozenset({"memset"}),
        r"",
        "memory",
        "memset",
        "every memset activity, e.g. 'Memset (Device)'",
    ),
    _r(
        "memcpy_named",
        _KERNEL,
        r"^(?:Memcpy|memcpy)\b|^dma",
        "memory",
        "memcpy",
        "copies a reader emitted as kernels, 'Memcpy DtoH (Device -> Pageable)'",
    ),
    _r(
        "rocclr_blit",
        _KERNEL,
        r"^__amd_rocclr_copy",
        "memory",
        "memcpy",
        "ROCm runtime blit kernels behind hipMemcpy: __amd_rocclr_copyBuffer, __amd_rocclr_copyBufferRect",
    ),
    _r(
        "memset_named",
        _KERNEL,
        r"^(?:Memset|memset)\b|^__amd_rocclr_fill",
        "memory",
        "memset",
        "memsets a reader emitted as kernels, 'Memset (Device)'",
    ),
    # ---------------------------------------------------------------- GPU: collectives
    _r(
        "nccl",
        _KERNEL,
        r"^(?:void\s+)?nccl\w*Kernel",
        "collective",
        "nccl",
        "NCCL (and RCCL, same names): ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_Generic_4, "
        "ncclSymkDevKernel_AllReduce_AGxLL_R, ncclAllReduceRingLLKernel_sum_f32",
    ),
    _r(
        "rccl",
        _KERNEL,
        r"^(?:void\s+)?(?:rccl|msccl(?!pp))\w*",
        "collective",
        "rccl",
        "RCCL-specific kernels: rcclGenericKernel, MSCCL mscclKernel_Sum_float_LL",
    ),
    _r(
        "custom_allreduce",
        _KERNEL,
        r"cross_device_reduce_[12]stage|multimem_\w*(?:all_?reduce|all_?gather|reduce_?scatter)"
        r"|(?:one|two)[_-]?shot[_-]?all[_-]?reduce|allreduce_fusion|all_?reduce_?fusion|lamport"
        r"|custom_?all_?reduce|quick_?all_?reduce|allreduce_prototype|symmetric_memory::|^(?:void\s+)?mscclpp"
        r"|trtllm_\w*allreduce::|^(?:void\s+)?nvshmem",
        "collective",
        "custom_allreduce",
        "vllm::cross_device_reduce_1stage, multimem_all_reduce_kernel, one_shot_all_reduce_kernel, "
        "allreduce_fusion_kernel_oneshot_lamport, oneShotAllReduceKernel, twoShotAllReduceKernel, "
        "flashinfer::trtllm_mnnvl_allreduce::twoshotAllreduceKernel, rmsNormLamport, mscclpp, nvshmem",
        _I,
    ),
    _r(
        "expert_all_to_all",
        _KERNEL,
        r"deep_ep::|\bdispatch_kernel\b.*intranode|intranode::(?:dispatch|combine)|internode(?:_ll)?::(?:dispatch|combine)"
        r"|pplx::\w*(?:dispatch|combine)|moeA2A\w*(?:Dispatch|Combine)|\ballToAllV|exchangeSplitAndOffset"
        r"|[Aa]ll_?[Tt]o_?[Aa]ll",
        "collective",
        "all_to_all",
        "device-initiated all-to-all: DeepEP deep_ep::intranode::dispatch, deep_ep::internode_ll::combine, "
        "TensorRT-LLM moeA2ADispatchKernel / moeA2ACombineKernel, pplx::dispatchKernel, PyTorch NVSHMEM allToAllV, "
        "dlslime::intranode_alltoall_kernel",
    ),
    _r(
        "comm_like_name",
        _KERNEL,
        r"all_?reduce|all_?gather|reduce_?scatter|multimem|symm_?mem|\bsymm_|one_?shot|two_?shot|cross_?device"
        r"|nvls|(?:^|[^a-z])a2a(?:[^a-z]|$)",
        "unknown",
        "comm_like",
        "names that look like communication but match no collective rule: my_allreduce_kernel, "
        "foo_all_gather_kernel, nvls_reduce_kernel (unknown with a hint, not compute)",
        _I,
    ),
    # ---------------------------------------------------------------- GPU: compute, vector helpers that
    # would otherwise hit a matrix library name (must come first)
    _r(
        "kv_cache",
        _KERNEL,
        r"store_kvcache|reshape_and_cache|concat_and_cache|kv_indices|set_kv_buffer|kv_cache_\w*kernel",
        "compute",
        "vector",
        "KV-cache writes / index preparation: store_kvcache, reshape_and_cache_flash_kernel, "
        "create_flashinfer_kv_indices_triton (case-sensitive: 'Fp8KVCacheDataType' in an attention template is not one)",
    ),
    _r(
        "conv_helpers",
        _KERNEL,
        r"cask_cudnn\w*::compute\w*Offsets|nchwToNhwc|nhwcToNchw",
        "compute",
        "vector",
        "cuDNN's small offset / layout kernels around a convolution: cask_cudnn_train::computeWgradBOffsetsKernel",
    ),
    # ---------------------------------------------------------------- GPU: compute, matrix (tensor core)
    _r(
        "attention",
        _KERNEL,
        r"attention|attn|flash_?(?:fwd|bwd|decod|mla)|flashinfer|fmha|\bmha_|_mha_|flashmla|\bmla_|_mla_"
        r"|BatchDecode|BatchPrefill|sdpa|xformers|\bgqa_|_gqa_|\bmqa_",
        "compute",
        "matrix",
        "attention kernels, incl. their split-K combine: paged_attention_ll4mi_QKV_mfma16_kernel, "
        "paged_attention_ll4mi_reduce_kernel, flash_fwd_splitkv_kernel, fmha_cutlassF",
        _I,
    ),
    _r(
        "convolution",
        _KERNEL,
        r"scudnn|implicit_?gemm|convolution|winograd|dgrad|wgrad|fprop|conv[123]d|_conv_|cudnn_\w*_conv",
        "compute",
        "matrix",
        "cuDNN convolutions: cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1, sm80_xmma_fprop_implicit_gemm_*, "
        "winogradForwardData4x4, wgrad_alg0_engine",
        _I,
    ),
    _r(
        "gemm_library",
        _KERNEL,
        r"cutlass|cublas|nvjet|xmma|^Cijk_|hipblaslt|deep_gemm|marlin|machete|\bck::|rocblas|tensorop",
        "compute",
        "matrix",
        "GEMM libraries: cutlass::Kernel<cutlass_80_tensorop_s1688gemm...>, cublasLt::splitKreduce_kernel "
        "(the GEMM's split-K reduction), nvjet_sm90_tst_*, sm90_xmma_gemm_*, Cijk_Alik_Bljk_* (rocBLAS/Tensile)",
        _I,
    ),
    _r(
        "gemm_named",
        _KERNEL,
        r"(?<!fb)gemm|gemv|wvSplitK|mfma|wmma|splitKreduce|scaled_mm|grouped_mm|fused_moe|moe_gemm|matmul|_mm_kernel"
        r"|^triton_tem_|\bbmm",
        "compute",
        "matrix",
        "kernels named for a matrix product: ampere_sgemm_32x128_nt, volta_sgemm_64x64_nn, gemvNSP_kernel, "
        "wvSplitK_hf_, gemmk1_kernel, fused_moe_kernel, triton_tem_fused_mm_0 (not fbgemm_gpu::*)",
        _I,
    ),
    # ---------------------------------------------------------------- GPU: compute, vector (CUDA core)
    _r(
        "triton",
        _KERNEL,
        r"^triton_|triton",
        "compute",
        "vector",
        "Inductor / Triton pointwise, reduction, persistent kernels: triton_poi_fused_add_0, triton_red_fused_sum_1",
    ),
    _r(
        "norm_softmax",
        _KERNEL,
        r"norm|softmax",
        "compute",
        "vector",
        "normalisations and softmax: rms_norm_kernel, add_rmsnorm_quant_kernel, softmax_warp_forward, "
        "cudnn::bn_fw_tr_1C11_kernel_NCHW",
        _I,
    ),
    _r(
        "aten_native",
        _KERNEL,
        r"at::native::|at::cuda::|at_cuda_detail::|c10::cuda::",
        "compute",
        "vector",
        "ATen's own CUDA kernels (elementwise, reduce, index, copy, sort): at::native::vectorized_elementwise_kernel, "
        "at::native::reduce_kernel, at::cuda::(anonymous namespace)::spin_kernel",
    ),
    _r(
        "elementwise_reduce",
        _KERNEL,
        r"elementwise|reduce_kernel|reduction|unrolled|vectorized",
        "compute",
        "vector",
        "elementwise and (local, on-GPU) reductions outside ATen: elementwise_kernel, reduce_kernel",
        _I,
    ),
    _r(
        "activation_rope",
        _KERNEL,
        r"silu|gelu|relu|swiglu|act_and_mul|activation|sigmoid|tanh|rotary|rope_|_rope|embedding",
        "compute",
        "vector",
        "activations, rotary and embedding kernels: act_and_mul_kernel, rotary_embedding_kernel, "
        "split_embedding_codegen_forward_unweighted_kernel",
        _I,
    ),
    _r(
        "quant_convert",
        _KERNEL,
        r"quant|fp8|fp4|int8|hfp8|bf16|cast|convert|to_float|float_to",
        "compute",
        "vector",
        "(de)quantisation and dtype conversion: _FP8rowwise_to_float_cuda_kernel, per_token_quant_fp8",
        _I,
    ),
    _r(
        "data_movement",
        _KERNEL,
        r"copy|gather|scatter|index|permute|transpose|concat|CatArray|fill|arange|split|pad|slice|sort|scan|topk|top_k"
        r"|argmax|sampl|cumsum|histogram|unique|nchwToNhwc|nhwcToNchw|compact|offsets|lengths|segment|bounds_check",
        "compute",
        "vector",
        "on-SM data movement and indexing: CatArrayBatchedCopy, permute_2D_lengths_kernel, linearize_index_kernel, "
        "DeviceRadixSortOnesweepKernel, bounds_check_indices_kernel",
        _I,
    ),
    _r(
        "vector_libraries",
        _KERNEL,
        r"\bcub::|rocprim::|thrust::|hipcub|fbgemm_gpu::|cudnn::|cask_cudnn|cudnn_|\baiter::|_ZN5aiter|sgl_hip|sglang::"
        r"|vllm::|flashinfer::|tensorrt_llm::|\bck_tile::|epilogue::|scal_kernel",
        "compute",
        "vector",
        "the remaining kernels of known libraries, which are CUDA-core work (scans, sorts, layout transforms, "
        "BLAS-1 helpers): cub::DeviceScanKernel, rocprim trampoline_kernel, cudnn::ops::scalePackedTensor_kernel",
    ),
    _r(
        "comm_like_moe",
        _KERNEL,
        r"(?:moe|expert|ep)_?(?:dispatch|combine)|(?:^|[^a-z])(?:dispatch|combine)(?:_?kernel)?(?:[^a-z]|$)",
        "unknown",
        "comm_like",
        "MoE all-to-all dispatch / combine that no all-to-all rule knows: ep_dispatch_kernel, "
        "moe_combine (after the compute rules: flash_fwd_splitkv_combine_kernel is attention)",
        _I,
    ),
    _r(
        "other_kernel",
        _KERNEL,
        r"",
        "compute",
        "other",
        "any other kernel: it runs on the SMs, so it is compute (Triton MoE routing, a project's own CUDA "
        "kernels: compute_cuda_kernel, clamp_position_kernel)",
    ),
    # ---------------------------------------------------------------- host: synchronisation
    _r(
        "stream_wait_event",
        frozenset({"sync"}),
        r"^Stream Wait Event$",
        "host",
        "stream_wait_event",
        "CUPTI's 'Stream Wait Event' is a device-side dependency (cudaStreamWaitEvent): the host does not block",
    ),
    _r(
        "cuda_sync_stream",
        frozenset({"sync"}),
        r"Stream Sync",
        "sync",
        "stream_sync",
        "Kineto cuda_sync 'Stream Sync'",
    ),
    _r(
        "cuda_sync_event",
        frozenset({"sync"}),
        r"Event Sync",
        "sync",
        "event_sync",
        "Kineto cuda_sync 'Event Sync'",
    ),
    _r(
        "cuda_sync_context",
        frozenset({"sync"}),
        r"Context Sync",
        "sync",
        "device_sync",
        "Kineto cuda_sync 'Context Sync'",
    ),
    _r(
        "cuda_sync_other", frozenset({"sync"}), r"", "sync", "cuda_sync", "any other host-blocking sync event"
    ),
    _r(
        "stream_synchronize",
        _HOST_CALLS,
        r"^(?:cuda|hip|cu)StreamSynchronize",
        "sync",
        "stream_sync",
        "cudaStreamSynchronize, hipStreamSynchronize, cuStreamSynchronize",
    ),
    _r(
        "device_synchronize",
        _HOST_CALLS,
        r"^(?:cuda|hip)(?:Device|Thread)Synchronize|^cuCtxSynchronize",
        "sync",
        "device_sync",
        "cudaDeviceSynchronize, hipDeviceSynchronize, cuCtxSynchronize",
    ),
    _r(
        "event_synchronize",
        _HOST_CALLS,
        r"^(?:cuda|hip|cu)EventSynchronize",
        "sync",
        "event_sync",
        "cudaEventSynchronize, hipEventSynchronize",
    ),
    _r(
        "synchronous_memcpy",
        _HOST_CALLS,
        r"^(?:cuda|hip)Memcpy(?:2D|3D|Peer|ToSymbol|FromSymbol|ToArray|FromArray)?(?:_v\d+)?$|^hipMemcpyWithStream$"
        r"|^cuMemcpy(?:DtoH|HtoD|DtoD|Peer)?(?:_v\d+)?$",
        "sync",
        "sync_copy",
        "blocking copies: cudaMemcpy (not cudaMemcpyAsync), hipMemcpyWithStream (PyTorch ROCm's blocking copy)",
    ),
    _r(
        "item",
        frozenset({"cpu_op"}),
        r"^aten::(?:_local_scalar_dense|item)$",
        "sync",
        "item",
        ".item() / tensor-to-Python-scalar: copies one value to the host and waits for the device",
    ),
    # ---------------------------------------------------------------- host: collectives
    _r(
        "gloo",
        _HOST_OPS,
        r"^gloo:",
        "collective",
        "gloo",
        "ProcessGroupGloo work on its worker thread: gloo:all_reduce",
    ),
    _r(
        "c10d",
        _HOST_OPS,
        r"^c10d::|^record_param_comms$|^c10d_functional::|^_c10d_functional::",
        "collective",
        "c10d",
        "the collective's CPU op on the calling thread: c10d::allreduce_, record_param_comms",
    ),
    _r(
        "process_group_annotation",
        frozenset({"annotation"}),
        r"^(?:nccl|rccl|mpi|ucc|xccl):",
        "collective",
        "pg_host",
        "ProcessGroup ranges on the host: nccl:all_reduce (the GPU work is the NCCL kernel)",
    ),
    # ---------------------------------------------------------------- host: everything else
    _r("host", HOST_KINDS, r"", "host", "host", "any other host event (aten ops, launches, annotations)"),
    _r(
        "gpu_annotation",
        frozenset({"gpu_annotation"}),
        r"",
        "host",
        "gpu_annotation",
        "user ranges projected on a GPU stream: markers, not activity",
    ),
)

#: The class of anything no rule matches.
UNKNOWN = ("unknown", "unknown", "unknown")

#: Said with every kernel the classifier leaves unknown (rules comm_like_name / comm_like_moe).
COMM_LIKE_HINT = (
    "the name looks like communication (all-reduce, all-gather, all-to-all, MoE dispatch/combine...) but "
    "matches no collective rule, so it is kept apart as 'unknown' rather than counted as compute or collective; "
    "if it is a collective, add a rule to tracekit/classify/rules.py (or report the kernel name and its library)"
)


_ANON = "(anonymous namespace)"


def strip_parameters(name: str) -> str:
    """The name without its parameter list: rules look at the function and its template arguments,
    never at parameter types (a parameter of type `fbgemm_gpu::FixedDivisor` or
    `vllm::Fp8KVCacheDataType` says nothing about the kernel).

    The parameter list is the first '(' at template depth 0 that does not open
    "(anonymous namespace)". `ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, ...)` ->
    `ncclKernel_AllReduce_RING_LL_Sum_float`; `Memcpy DtoD (Device -> Device)` -> `Memcpy DtoD `.
    """
    if "(" not in name:
        return name
    depth = 0
    i = 0
    n = len(name)
    while i < n:
        ch = name[i]
        if ch == "<":
            depth += 1
        elif ch == ">":
            if i > 0 and name[i - 1] == "-":  # "->" is an arrow, not a bracket
                pass
            elif depth > 0:
                depth -= 1
        elif ch == "(":
            if name.startswith(_ANON, i):
                i += len(_ANON)
                continue
            if depth == 0:
                return name[:i]
            # a parenthesis inside template arguments (a lambda's signature): skip to its match
            close = _matching_paren(name, i)
            i = close + 1
            continue
        i += 1
    return name


def _matching_paren(name: str, start: int) -> int:
    level = 0
    for j in range(start, len(name)):
        if name[j] == "(":
            level += 1
        elif name[j] == ")":
            level -= 1
            if level == 0:
                return j
    return len(name) - 1


def match(kind: str, name: str) -> Rule | None:
    """The first rule that applies to (kind, name), or None (-> unknown)."""
    base = strip_parameters(name)
    for rule in RULES:
        if kind in rule.kinds and rule.pattern.search(base):
            return rule
    return None


def matching_rules(kind: str, name: str) -> list[Rule]:
    """Every rule that matches (kind, name), in table order (for the overlap test and --explain)."""
    base = strip_parameters(name)
    return [rule for rule in RULES if kind in rule.kinds and rule.pattern.search(base)]
