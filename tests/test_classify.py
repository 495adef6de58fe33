"""The classifier: a test per rule (real names -> expected class), the overlap check on every name in
the shared real traces, independent per-class counts, the unknown bucket, and speed."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import shared_params

from tracekit.classify import RULES, classify, classify_name, matching_rules
from tracekit.classify.rules import strip_parameters
from tracekit.model.documents import to_builtins
from tracekit.model.events import make_events

# (kind, real name as a profiler writes it, cls, subclass, rule). Names marked "trace" are copied
# from ../shared/traces; the others from the libraries' sources / public profiles.
CASES: list[tuple[str, str, str, str, str]] = [
    # memory
    ("memcpy", "Memcpy DtoD (Device -> Device)", "memory", "memcpy", "memcpy"),  # trace
    ("memset", "Memset (Device)", "memory", "memset", "memset"),  # trace
    ("kernel", "Memcpy HtoD (Pageable -> Device)", "memory", "memcpy", "memcpy_named"),
    ("kernel", "__amd_rocclr_copyBuffer", "memory", "memcpy", "rocclr_blit"),
    ("kernel", "Memset (Device)", "memory", "memset", "memset_named"),
    ("kernel", "__amd_rocclr_fillBufferAligned", "memory", "memset", "memset_named"),
    # collectives
    (
        "kernel",
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        "collective",
        "nccl",
        "nccl",
    ),  # trace
    (
        "kernel",
        "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
        "collective",
        "nccl",
        "nccl",
    ),  # trace
    (
        "kernel",
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
        "collective",
        "nccl",
        "nccl",
    ),  # trace
    ("kernel", "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "collective", "nccl", "nccl"),
    (
        "kernel",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "collective",
        "nccl",
        "nccl",
    ),
    ("kernel", "ncclAllReduceRingLLKernel_sum_f32(CollectiveArgs)", "collective", "nccl", "nccl"),
    ("kernel", "ncclDevKernel_Generic_1", "collective", "nccl", "nccl"),  # RCCL on MI300 (same name)
    (
        "kernel",
        "mscclKernel_Sum_hip_bfloat16_Simple_false(ncclDevComm*, mscclAlgo*, mscclWork*)",
        "collective",
        "rccl",
        "rccl",
    ),
    (
        "kernel",
        "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "aiter::cross_device_reduce_2stage<bf16,8,false>",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void c10d::symmetric_memory::multimem_all_reduce_kernel<__nv_bfloat16, 16, 8>(__nv_bfloat16*, unsigned long, unsigned int**, unsigned long, unsigned long)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 16, 4>(float**, float*, float*, unsigned long)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void tensorrt_llm::kernels::ar_fusion::allreduce_fusion_kernel_oneshot_lamport<__nv_bfloat16, 8>(tensorrt_llm::kernels::ar_fusion::AllReduceFusionParams)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void tensorrt_llm::kernels::oneShotAllReduceKernel<__nv_bfloat16, 8, false>(tensorrt_llm::kernels::AllReduceParams)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void tensorrt_llm::kernels::twoShotAllReduceKernel<float, 4>(tensorrt_llm::kernels::AllReduceParams)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*)",
        "collective",
        "all_to_all",
        "expert_all_to_all",
    ),
    # issue 15: the custom all-reduce / all-to-all kernels of serving engines, one case per name
    # (names from the engines' public sources: vLLM, SGLang / sgl-kernel, aiter, TensorRT-LLM,
    # FlashInfer, DeepEP, pplx-kernels, PyTorch symmetric memory, MSCCL++, NVSHMEM)
    (
        "kernel",
        "void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void sglang::cross_device_reduce_1stage<__nv_bfloat16, 2>(sglang::RankData*)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void aiter::cross_device_reduce_2stage<__hip_bfloat16, 8>(aiter::RankData*)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void quickreduce::allreduce_prototype_twoshot<AllReduceTwoshot<__half, CodecQ4<__half, 4>, true>, __half>(__half const*)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void trt_reduce::oneShotAllReduceKernel<__nv_bfloat16, 8>(trt_reduce::AllReduceParams)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void tensorrt_llm::kernels::ar_fusion::allreduce_fusion_kernel_twoshot_sync<__nv_bfloat16, 4, true>(AllReduceFusionParams<__nv_bfloat16>)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<__nv_bfloat16, 8>(AllReduceFusionParams<__nv_bfloat16>)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void flashinfer::trtllm_mnnvl_allreduce::twoshotAllreduceKernel<(unsigned char)4, __nv_bfloat16, true>(flashinfer::trtllm_mnnvl_allreduce::AllReduceFusionParams)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void flashinfer::trtllm_mnnvl_allreduce::oneshotAllreduceFusionKernel<(unsigned char)2, __nv_bfloat16>(flashinfer::trtllm_mnnvl_allreduce::AllReduceFusionParams)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void tensorrt_llm::kernels::mnnvl::rmsNormLamport<__nv_bfloat16>(float*, int)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void tensorrt_llm::kernels::moereduce_allreduce_fusion_kernel_oneshot_lamport<__nv_bfloat16, 4>(MoeReductionAllReduceFusionParams)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long, unsigned int**, unsigned long, unsigned long)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void c10d::symmetric_memory::two_shot_all_reduce_kernel_inplace<float, 16, 8>(float*, unsigned long)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void (anonymous namespace)::multimem_all_gather_kernel<16>(char*, unsigned long)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    (
        "kernel",
        "void mscclpp::allreduce8<__nv_bfloat16>(__nv_bfloat16*, mscclpp::DeviceHandle)",
        "collective",
        "custom_allreduce",
        "custom_allreduce",
    ),
    ("kernel", "nvshmemi_proxy_progress_kernel", "collective", "custom_allreduce", "custom_allreduce"),
    (
        "kernel",
        "void deep_ep::internode_ll::combine<false, 8192>(void*, int*)",
        "collective",
        "all_to_all",
        "expert_all_to_all",
    ),
    (
        "kernel",
        "void deep_ep::intranode::notify_dispatch<8>(int const*, int*)",
        "collective",
        "all_to_all",
        "expert_all_to_all",
    ),
    (
        "kernel",
        "void tensorrt_llm::kernels::moe_comm::moeA2ADispatchKernel<8, 1>(int const*, KernelPointers)",
        "collective",
        "all_to_all",
        "expert_all_to_all",
    ),
    (
        "kernel",
        "void tensorrt_llm::kernels::moe_comm::moeA2ACombineKernel<__nv_bfloat16, 8>(CombineKernelPointers)",
        "collective",
        "all_to_all",
        "expert_all_to_all",
    ),
    (
        "kernel",
        "void moeA2APrepareDispatchKernel(int*, int*, int, unsigned int*)",
        "collective",
        "all_to_all",
        "expert_all_to_all",
    ),
    (
        "kernel",
        "void pplx::dispatchKernel<32, 8, 2>(int*, unsigned long)",
        "collective",
        "all_to_all",
        "expert_all_to_all",
    ),
    (
        "kernel",
        "allToAllV(void*, void*, long*, unsigned long, int)",
        "collective",
        "all_to_all",
        "expert_all_to_all",
    ),
    (
        "kernel",
        "allToAllV_2d(void*, void*, long*, long*, unsigned long, int, int, long, bool)",
        "collective",
        "all_to_all",
        "expert_all_to_all",
    ),
    ("kernel", "exchangeSplitAndOffset(long*, long*, int)", "collective", "all_to_all", "expert_all_to_all"),
    (
        "kernel",
        "void dlslime::intranode_alltoall_kernel<8>(void**, int)",
        "collective",
        "all_to_all",
        "expert_all_to_all",
    ),
    # names that look like communication but match no rule: unknown (with a hint), never compute
    ("kernel", "void my_project::allreduce_kernel<float>(float*)", "unknown", "comm_like", "comm_like_name"),
    ("kernel", "fused_all_gather_matmul_kernel", "unknown", "comm_like", "comm_like_name"),
    ("kernel", "void reduce_scatter_bf16(__nv_bfloat16*)", "unknown", "comm_like", "comm_like_name"),
    ("kernel", "nvls_reduce_kernel", "unknown", "comm_like", "comm_like_name"),
    ("kernel", "my_a2a_kernel", "unknown", "comm_like", "comm_like_name"),
    ("kernel", "ep_dispatch_kernel", "unknown", "comm_like", "comm_like_moe"),
    ("kernel", "void moe_combine<float>(float*)", "unknown", "comm_like", "comm_like_moe"),
    # ... while a split-K combine of attention stays attention
    (
        "kernel",
        "void flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>(Flash_fwd_params)",
        "compute",
        "matrix",
        "attention",
    ),
    # compute, matrix
    (
        "kernel",
        "void paged_attention_ll4mi_reduce_kernel<__hip_bfloat16, __hip_bfloat16, 128, 128, 256, 3, false>(__hip_bfloat16*, float const*, float const*, __hip_bfloat16 const*, int const*, int, int)",
        "compute",
        "matrix",
        "attention",
    ),  # trace
    (
        "kernel",
        "void paged_attention_ll4mi_QKV_mfma16_kernel<0, __hip_bfloat16, __hip_bfloat16, (vllm::Fp8KVCacheDataType)0, 1, 128, 256, false, 4, 1>(__hip_bfloat16 const*)",
        "compute",
        "matrix",
        "attention",
    ),  # trace
    (
        "kernel",
        "void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t>, false>(Flash_fwd_params)",
        "compute",
        "matrix",
        "attention",
    ),
    (
        "kernel",
        "void kn_mla_reduce_v1<MlaReduceKernelV1Traits<512, 128, 1>>",
        "compute",
        "matrix",
        "attention",
    ),
    (
        "kernel",
        "cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1",
        "compute",
        "matrix",
        "convolution",
    ),  # trace
    (
        "kernel",
        "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x128x32_stage5_warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_infer",
        "compute",
        "matrix",
        "convolution",
    ),  # trace
    ("kernel", "nvjet_sm90_tst_128x8_64x12_2x1_v_bz_NNT", "compute", "matrix", "gemm_library"),  # trace
    (
        "kernel",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
        "compute",
        "matrix",
        "gemm_library",
    ),
    (
        "kernel",
        "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT16x32x512_MI16x16x1_SN_LDSB1_AFC1",
        "compute",
        "matrix",
        "gemm_library",
    ),  # trace
    (
        "kernel",
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>(cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4::Params)",
        "compute",
        "matrix",
        "gemm_library",
    ),  # trace
    (
        "kernel",
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false>(cublasLt::cublasSplitKParams<float>, float const*)",
        "compute",
        "matrix",
        "gemm_library",
    ),  # trace
    ("kernel", "ampere_sgemm_32x128_nt", "compute", "matrix", "gemm_named"),  # trace
    ("kernel", "volta_sgemm_64x64_nn", "compute", "matrix", "gemm_named"),  # trace
    (
        "kernel",
        "void gemvNSP_kernel<float, float, float, float, 1, 32, 4, 1024, cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, float> >(cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, float>)",
        "compute",
        "matrix",
        "gemm_library",
    ),  # trace ("cublas" in its template)
    (
        "kernel",
        "void gemv2T_kernel_val<int, int, float, float, float, 128, 16, 2, 2, false, false>(float const*, float*)",
        "compute",
        "matrix",
        "gemm_named",
    ),
    (
        "kernel",
        "void wvSplitK_hf_sml_<__hip_bfloat16, 64, 2, 16, 8, 2, 1>(int, int, int, __hip_bfloat16 const*)",
        "compute",
        "matrix",
        "gemm_named",
    ),
    ("kernel", "triton_tem_fused_mm_0", "compute", "matrix", "gemm_named"),
    # compute, vector
    (
        "kernel",
        "void (anonymous namespace)::store_kvcache<2048l, 4, false, long>((anonymous namespace)::StoreKVCacheParams)",
        "compute",
        "vector",
        "kv_cache",
    ),  # trace
    ("kernel", "create_flashinfer_kv_indices_triton", "compute", "vector", "kv_cache"),  # trace
    (
        "kernel",
        "cask_cudnn_train::computeWgradBOffsetsKernel(cask_cudnn_train::ComputeWgradBOffsetsParams)",
        "compute",
        "vector",
        "conv_helpers",
    ),  # trace
    ("kernel", "triton_poi_fused_add_mul_0", "compute", "vector", "triton"),
    ("kernel", "triton_red_fused__to_copy_add_mean_1", "compute", "vector", "triton"),
    (
        "kernel",
        "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib",
        "compute",
        "vector",
        "norm_softmax",
    ),  # trace
    (
        "kernel",
        "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true, false>(float*, float const*, int, int, int, bool const*, int, bool)",
        "compute",
        "vector",
        "norm_softmax",
    ),  # trace
    (
        "kernel",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
        "compute",
        "vector",
        "aten_native",
    ),  # trace
    (
        "kernel",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4>)",
        "compute",
        "vector",
        "aten_native",
    ),  # trace
    (
        "kernel",
        "void my_lib::elementwise_kernel<float>(float*, int)",
        "compute",
        "vector",
        "elementwise_reduce",
    ),
    (
        "kernel",
        "_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16TnPFT_RKS3_EXadL_Z4siluIS2_ES3_S5_EEEEvPS3_PS4_i",
        "compute",
        "vector",
        "activation_rope",
    ),  # trace
    (
        "kernel",
        "void rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, c10::BFloat16*, c10::BFloat16 const*, int, long, long, long, int, int, int)",
        "compute",
        "vector",
        "activation_rope",
    ),  # trace
    (
        "kernel",
        "void fbgemm_gpu::(anonymous namespace)::_FP8rowwise_to_float_cuda_kernel<float>(unsigned char const*, int, int, float*, bool)",
        "compute",
        "vector",
        "quant_convert",
    ),  # trace
    (
        "kernel",
        "void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*, int*)",
        "compute",
        "vector",
        "data_movement",
    ),  # trace
    (
        "kernel",
        "void linearize_index_kernel<long>(at::GenericPackedTensorAccessor<long, 1ul, at::RestrictPtrTraits, int>)",
        "compute",
        "vector",
        "data_movement",
    ),  # trace
    (
        "kernel",
        "void cub::DeviceScanInitKernel<cub::ScanTileState<int, true> >(cub::ScanTileState<int, true>, int)",
        "compute",
        "vector",
        "data_movement",
    ),  # trace ("Scan")
    (
        "kernel",
        "void cub::DeviceReduceSingleTileKernel<cub::DeviceReducePolicy<float, int, cub::Sum>::Policy600, float*, float*, int, cub::Sum, float>(float*, float*, int, cub::Sum, float)",
        "compute",
        "vector",
        "vector_libraries",
    ),
    (
        "kernel",
        "void cudnn::ops::scalePackedTensor_kernel<float, float>(cudnnTensor4dStruct, float*, float)",
        "compute",
        "vector",
        "vector_libraries",
    ),  # trace
    # no rule names it and it does not look like communication: compute, subclass other (issue 15)
    (
        "kernel",
        "void compute_cuda_kernel<long>(long*, long*, long*, long, long)",
        "compute",
        "other",
        "other_kernel",
    ),  # trace
    (
        "kernel",
        "void (anonymous namespace)::clamp_position_kernel<long>(long*, long const*, unsigned long)",
        "compute",
        "other",
        "other_kernel",
    ),  # trace
    ("kernel", "my_custom_kernel", "compute", "other", "other_kernel"),
    ("kernel", "cupy_multiply__float64_float64_float64", "compute", "other", "other_kernel"),  # trace (nsys)
    # host: synchronisation
    ("sync", "Stream Wait Event", "host", "stream_wait_event", "stream_wait_event"),
    ("sync", "Stream Sync", "sync", "stream_sync", "cuda_sync_stream"),  # trace
    ("sync", "Event Sync", "sync", "event_sync", "cuda_sync_event"),  # trace
    ("sync", "Context Sync", "sync", "device_sync", "cuda_sync_context"),  # trace
    ("sync", "Unknown", "sync", "cuda_sync", "cuda_sync_other"),
    ("runtime", "cudaStreamSynchronize", "sync", "stream_sync", "stream_synchronize"),  # trace
    ("runtime", "cudaDeviceSynchronize", "sync", "device_sync", "device_synchronize"),  # trace
    ("runtime", "hipDeviceSynchronize", "sync", "device_sync", "device_synchronize"),  # trace
    ("runtime", "cudaEventSynchronize", "sync", "event_sync", "event_synchronize"),  # trace
    ("runtime", "cudaMemcpy", "sync", "sync_copy", "synchronous_memcpy"),
    ("runtime", "hipMemcpyWithStream", "sync", "sync_copy", "synchronous_memcpy"),  # trace
    ("cpu_op", "aten::_local_scalar_dense", "sync", "item", "item"),
    ("cpu_op", "aten::item", "sync", "item", "item"),  # trace
    # host: collectives
    ("annotation", "gloo:all_reduce", "collective", "gloo", "gloo"),  # trace + our own capture
    ("cpu_op", "c10d::allreduce_", "collective", "c10d", "c10d"),  # our own gloo capture
    ("cpu_op", "record_param_comms", "collective", "c10d", "c10d"),
    ("annotation", "nccl:all_reduce", "collective", "pg_host", "process_group_annotation"),  # trace
    # host: the rest
    ("runtime", "cudaMemcpyAsync", "host", "host", "host"),  # trace: not blocking
    ("runtime", "cudaLaunchKernel", "host", "host", "host"),  # trace
    ("cpu_op", "aten::mm", "host", "host", "host"),
    ("annotation", "decode_step", "host", "host", "host"),  # trace
    ("gpu_annotation", "decode_step", "host", "gpu_annotation", "gpu_annotation"),  # trace
]


@pytest.mark.parametrize(
    ("kind", "name", "cls", "subclass", "rule"), CASES, ids=[f"{c[4]}:{c[1][:40]}" for c in CASES]
)
def test_rule_table(kind: str, name: str, cls: str, subclass: str, rule: str) -> None:
    assert classify_name(kind, name) == (cls, subclass, rule)


def test_every_rule_has_a_case() -> None:
    tested = {c[4] for c in CASES}
    assert {r.name for r in RULES} <= tested, sorted({r.name for r in RULES} - tested)


def test_rule_names_unique_and_classes_known() -> None:
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert {r.cls for r in RULES} <= {"compute", "memory", "collective", "unknown", "sync", "host"}
    # unknown only for names that look like communication
    assert {r.name for r in RULES if r.cls == "unknown"} == {"comm_like_name", "comm_like_moe"}


def test_reduce_in_a_name_is_not_a_collective() -> None:
    for name in (
        "void paged_attention_ll4mi_reduce_kernel<__hip_bfloat16, __hip_bfloat16, 128, 128, 256, 3, false>(float*)",
        "void at::native::reduce_kernel<512, 1>(int)",
        "void splitKreduce_kernel<32, 16, int, float>(cublasSplitKParams<float>)",
        "void cudnn::cnn::reduce_wgrad_nchw_helper<float, float>(void*, void const*, float, int, int)",
    ):
        assert classify_name("kernel", name)[0] == "compute", name


def test_parameters_do_not_classify() -> None:
    # a parameter type naming a KV-cache or fbgemm says nothing about the kernel
    assert strip_parameters("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long)") == (
        "ncclKernel_AllReduce_RING_LL_Sum_float"
    )
    assert strip_parameters("void (anonymous namespace)::f<int>(int)") == "void (anonymous namespace)::f<int>"
    assert strip_parameters("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD "
    assert classify_name("kernel", "void foo_kernel(fbgemm_gpu::FixedDivisor, vllm::Fp8KVCacheDataType)") == (
        "compute",
        "other",
        "other_kernel",
    )


# ------------------------------------------------------------------ the shared real traces

KINETO_TRACES = [
    "h200/kineto_decode_ws1.pt.trace.json.gz",
    "external/hta/nccl_data.json.gz",
    "external/hta/sampled_rank-0.json.gz",
    "external/hta/sampled_rank-1.json.gz",
    "external/hta/ns_resolution_rank-0.pt.trace.json.gz",
    "external/hta/cuda_event_sync_trace.json.gz",
    "external/hta/cpu_only_rank-34.pt.trace.json.gz",
    "external/hta/distributed_info_not_found.json.gz",
    "external/hta/mi250_minitoy_rocm.json.gz",
    "external/tracelens/sglang_qwen3-8b_decode.json.gz",
]
_KIND_OF_CAT = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "cuda_sync": "sync",
    "cpu_op": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
}


def _json_events(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        doc = json.load(f, parse_float=Decimal)
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and "ts" in e]


#: Pairs of rules whose classes differ yet both match a real name; the first must win.
ALLOWED_CROSS_CLASS_OVERLAPS = {
    # "ncclKernel_Broadcast_RING_LL_Sum_int8_t": the NCCL prefix wins over "int8" (quantisation)
    ("nccl", "quant_convert"),
}


def test_no_unintended_overlap_on_real_names(shared_traces: Path) -> None:
    """Every distinct (kind, name) of the shared traces: the positive rules (not the catch-alls)
    that match it must agree on the class, except for reviewed pairs where table order decides."""
    pairs: set[tuple[str, str]] = set()
    for rel in KINETO_TRACES:
        p = shared_traces / rel
        if p.exists():
            pairs |= {(_KIND_OF_CAT.get(e.get("cat"), "other"), e.get("name", "")) for e in _json_events(p)}
    assert len(pairs) > 500
    seen_overlaps = set()
    for kind, name in pairs:
        # the comm-like nets (cls unknown) sit after the collective rules on purpose: a NCCL name matches
        # them too; that every real name here escapes them is checked below
        rules = [r for r in matching_rules(kind, name) if r.pattern.pattern and r.cls != "unknown"]
        if kind in ("kernel", "memcpy", "memset"):
            assert classify_name(kind, name)[0] != "unknown", name
        classes = {r.cls for r in rules}
        if len(classes) > 1:
            key = (rules[0].name, *(r.name for r in rules[1:] if r.cls != rules[0].cls))
            seen_overlaps.add(key)
            assert key in ALLOWED_CROSS_CLASS_OVERLAPS, (kind, name, [r.name for r in rules])
    assert seen_overlaps == ALLOWED_CROSS_CLASS_OVERLAPS  # the allowed list stays honest


def _independent_counts(path: Path) -> dict[str, tuple[int, int]]:
    """GPU events per class with plain json and the published NCCL naming convention: a kernel is an
    NCCL collective when its name starts with "nccl" and contains "Kernel" (ncclKernel_*,
    ncclDevKernel_*, nccl<Coll>Kernel_*); memcpy/memset by category. Durations in ns (exact)."""
    out: Counter[str] = Counter()
    dur: Counter[str] = Counter()
    for e in _json_events(path):
        cat = e.get("cat")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        name = e.get("name", "")
        if cat != "kernel":
            key = "memory"
        elif name.startswith("nccl") and "Kernel" in name:
            key = "collective"
        else:
            key = "other"
        out[key] += 1
        dur[key] += int((Decimal(e["dur"]) * 1000).to_integral_value())
    return {k: (out[k], dur[k]) for k in ("memory", "collective", "other")}


@pytest.mark.parametrize("rel", shared_params(KINETO_TRACES))
def test_kernels_per_class_match_independent_count(shared_traces: Path, rel: str) -> None:
    from tracekit.analyse.timeline.breakdown import gpu_time_by
    from tracekit.read import read_run

    path = shared_traces / rel
    if not path.exists():
        pytest.skip(f"{rel} absent")
    run = read_run([path], rank=0 if "rank" not in path.name else None, cache=False)
    by_cls = gpu_time_by(classify(run.events), "cls")
    expect = _independent_counts(path)
    assert (by_cls["memory"]["count"], by_cls["memory"]["total_ns"]) == expect["memory"]
    # no custom all-reduce in these traces, so the collective class is exactly the NCCL convention
    assert (by_cls["collective"]["count"], by_cls["collective"]["total_ns"]) == expect["collective"]
    other = (
        by_cls["compute"]["count"] + by_cls["unknown"]["count"],
        by_cls["compute"]["total_ns"] + by_cls["unknown"]["total_ns"],
    )
    assert other == expect["other"]


def test_nccl_trace_has_its_collectives(shared_traces: Path) -> None:
    path = shared_traces / "external/hta/nccl_data.json.gz"
    if not path.exists():
        pytest.skip("nccl_data absent")
    counts = _independent_counts(path)
    assert counts["collective"][0] == 21  # 15 AllReduce + 6 Broadcast kernels (SOURCES.md / the file)


def test_unnamed_kernel_is_compute_other_not_unknown(shared_traces: Path) -> None:
    """Issue 15: a kernel no rule names (and whose name does not look like communication) is compute,
    subclass other: counted there with its time, and the unknown bucket stays empty."""
    from tracekit.analyse.timeline.breakdown import breakdown
    from tracekit.read import read_run

    path = shared_traces / "external/hta/sampled_rank-0.json.gz"
    if not path.exists():
        pytest.skip("sampled_rank-0 absent")
    # independent: the one kernel of this trace that no rule names, counted with plain json
    name = "void compute_cuda_kernel<long>(long*, long*, long*, long, long)"
    evs = [e for e in _json_events(path) if e.get("cat") == "kernel" and e.get("name") == name]
    b = breakdown(read_run([path], cache=False))
    total_ns = sum(int(Decimal(e["dur"]) * 1000) for e in evs)
    assert to_builtins(b.unknown_kernels) == []
    assert b.kernels_by_class["unknown"] == {"count": 0, "total_ns": 0}
    assert b.kernels_by_subclass["other"] == {"count": len(evs), "total_ns": total_ns}
    assert "unknown_kernel_events" not in b.data_quality.counts and len(evs) == 4


def test_comm_like_unknown_listed_with_a_hint() -> None:
    """A kernel that looks like communication but matches no rule is unknown, listed with the hint."""
    from tracekit.analyse.timeline.breakdown import breakdown
    from tracekit.classify.rules import COMM_LIKE_HINT
    from tracekit.model.events import Run

    ev = make_events(
        {
            "kind": ["annotation", "kernel", "kernel", "kernel"],
            "name": ["decode_step", "my_allreduce_kernel", "my_allreduce_kernel", "triton_moe_route_0"],
            "start_ns": [0, 10, 30, 50],
            "end_ns": [100, 20, 40, 60],
            "stream": [-1, 7, 7, 7],
        }
    )
    b = breakdown(Run(events=ev, sources={0: "x.json"}))
    assert to_builtins(b.unknown_kernels) == [
        {"name": "my_allreduce_kernel", "count": 2, "total_ns": 20, "hint": COMM_LIKE_HINT}
    ]
    assert b.kernels_by_class["compute"] == {"count": 1, "total_ns": 10}
    assert any(COMM_LIKE_HINT in n for n in b.data_quality.notes)


# ------------------------------------------------------------------ the table itself


def test_classify_columns_and_categories() -> None:
    ev = make_events(
        {
            "kind": ["kernel", "memcpy", "runtime", "annotation", "kernel"],
            "name": [
                "ampere_sgemm_32x128_nt",
                "Memcpy DtoD (Device -> Device)",
                "cudaStreamSynchronize",
                "decode_step",
                "zz",
            ],
            "start_ns": [0, 1, 2, 3, 4],
            "end_ns": [1, 2, 3, 4, 5],
        }
    )
    out = classify(ev)
    assert list(out["cls"]) == ["compute", "memory", "sync", "host", "compute"]
    assert list(out["subclass"]) == ["matrix", "memcpy", "stream_sync", "host", "other"]
    assert list(out["rule"]) == ["gemm_named", "memcpy", "stream_synchronize", "host", "other_kernel"]
    for col in ("cls", "subclass", "rule"):
        assert isinstance(out[col].dtype, pd.CategoricalDtype)
    assert "cls" not in ev.columns  # input untouched


def test_classify_empty() -> None:
    out = classify(make_events({}))
    assert len(out) == 0 and "cls" in out.columns


def test_classify_one_million_events() -> None:
    """The vectorised classifier agrees with the per-name one on 1M events (its speed:
    benchmarks/bench_refusals.py)."""
    rng = np.random.default_rng(0)
    pool = [c[1] for c in CASES if c[0] == "kernel"] + [
        f"void my_kernel_{i}<float>(float*)" for i in range(3000)
    ]
    n = 1_000_000
    names = pd.Categorical.from_codes(rng.integers(0, len(pool), n), categories=pool)
    kinds = pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=["kernel"])
    start = np.arange(n, dtype=np.int64) * 10
    ev = make_events({"kind": kinds, "name": names, "start_ns": start, "end_ns": start + 5})
    out = classify(ev)
    # same answer as the per-name function, on a sample
    for i in rng.integers(0, n, 200):
        assert (out["cls"].iat[i], out["rule"].iat[i]) == classify_name("kernel", pool[names.codes[i]])[::2]
