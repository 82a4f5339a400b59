"""Targets by name. Each knows its resources and defaults; rendering lives beside it."""

from .base import Target

_ALL = ("f16", "bf16", "f32", "f64", "i8", "u8", "i16", "i32", "i64", "i4", "u4")

CPU = Target("cpu", warp=1, max_threads=1024, tile_memory=4 << 20, mma=(1, 1, 1),
             gemm_tile=(128, 256, 256), gemm_stages=1, gemm_threads=1, row_block=1,
             ew_tile=(2, 16384), attn_tile=(64, 64), dtypes=_ALL)
# GPU targets: resources are validated today; their renderers are future issues.
CUDA = Target("cuda", warp=32, max_threads=1024, tile_memory=227 * 1024, mma=(16, 8, 16),
              gemm_tile=(128, 128, 32), gemm_stages=3, gemm_threads=128, row_block=4,
              ew_tile=(4, 256), attn_tile=(128, 64), dtypes=_ALL + ("fp8e4m3", "fp8e5m2"))
HIP = Target("hip", warp=64, max_threads=1024, tile_memory=64 * 1024, mma=(32, 32, 8),
             gemm_tile=(128, 128, 32), gemm_stages=2, gemm_threads=256, row_block=4,
             ew_tile=(4, 256), attn_tile=(128, 64), dtypes=_ALL)

TARGETS = {t.name: t for t in (CPU, CUDA, HIP)}
BUILDABLE = ("cpu",)


def get(name: str) -> Target:
    return TARGETS[name]
