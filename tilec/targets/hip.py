"""The HIP target (AMD GPUs): its resources are known, so schedules are validated against them;
its renderer (MFMA, LDS, wave64) is a future subclass of the CUDA one."""

from __future__ import annotations

from .base import Resources, Target, Toolchain
from .cpu import ALL_DTYPES

HIP = Target(
    name="hip",
    resources=Resources(
        warp=64, max_threads=1024, tile_memory=64 * 1024, mma=(32, 32, 8),
        gemm_tile=(128, 128, 32), gemm_stages=2, gemm_threads=256, row_block=1, row_threads=256,
        ew_tile=(1, 4096), ew_threads=256, attn_tile=(128, 64), attn_threads=256, attn_stages=2,
        dtypes=tuple(d for d in ALL_DTYPES if not d.startswith("fp8")), async_copy=False),
    toolchain=Toolchain("HIPCC", "hipcc", "HIP compiler"),
    templates="hip",
    source_ext=".hip",
    device_library="tilec_hip.h",
)
