"""The CUDA target (NVIDIA GPUs, sm_80 and later)."""

from __future__ import annotations

from .base import Resources, Target, Toolchain
from .cpu import ALL_DTYPES

CUDA = Target(
    name="cuda",
    resources=Resources(
        warp=32, max_threads=1024, tile_memory=227 * 1024, mma=(16, 8, 16),
        gemm_tile=(128, 128, 32), gemm_stages=4, gemm_threads=128, row_block=1, row_threads=256,
        ew_tile=(1, 4096), ew_threads=256, attn_tile=(128, 64), attn_threads=128, attn_stages=2,
        dtypes=ALL_DTYPES, async_copy=True, mma_dtypes=("f16", "bf16")),
    toolchain=Toolchain("NVCC", "nvcc", "CUDA compiler"),
    templates="cuda",
    source_ext=".cu",
    device_library="tilec_cuda.h",
    arch_choices=("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"),
    default_arch=("sm_80", "sm_90"),
    runtime="cuda",
)
