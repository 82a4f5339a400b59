// Hand-written probes that measure what limits tilec's memory-bound CUDA kernels, timed by
// bench/probes.py against the generated kernels and torch in the same process:
//   * read_probe: the weight-read pattern of the W4A16 M=1 GEMV alone (no math), for several
//     lane widths, bytes per row per warp and loads in flight: is DRAM locality or memory
//     parallelism what holds the GEMV at ~40% of DRAM bandwidth?
//   * rms_probe: RMSNorm (f16, 8192 columns, 256 threads per row) as tilec generates it and with
//     one change each: the scale vector loaded with the row, held per block, rows pipelined.
//   * copy_probe: a copy in tilec's elementwise shape and in a persistent grid-stride shape.
// Built by bench/probes.py: nvcc -O3 -arch=sm_90 -shared -Xcompiler -fPIC.
#include <cstdint>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

template <int LB> struct Vec;
template <> struct Vec<4> { typedef uint32_t T; static __device__ uint32_t fold(T v) { return v; } };
template <> struct Vec<8> { typedef uint2 T; static __device__ uint32_t fold(T v) { return v.x ^ v.y; } };
template <> struct Vec<16> {
    typedef uint4 T;
    static __device__ uint32_t fold(T v) { return v.x ^ v.y ^ v.z ^ v.w; }
};

// A 4-byte word read with an L2 prefetch size hint of PF bytes (0: a plain load)
template <int PF> __device__ __forceinline__ uint32_t ld_pf(const uint8_t* p) {
    uint32_t v;
    if constexpr (PF == 256) asm("ld.global.nc.L2::256B.b32 %0, [%1];" : "=r"(v) : "l"(p));
    else if constexpr (PF == 128) asm("ld.global.nc.L2::128B.b32 %0, [%1];" : "=r"(v) : "l"(p));
    else if constexpr (PF == 64) asm("ld.global.nc.L2::64B.b32 %0, [%1];" : "=r"(v) : "l"(p));
    else v = *reinterpret_cast<const uint32_t*>(p);
    return v;
}

// Block b reads column block b % ncb (COOP * WB bytes wide) of the rows of K slice b / ncb
// (`slice` rows): warp w reads the WB-byte segment w % COOP of that block, in row slice
// w / COOP (COOP 1: each warp a whole column block, its warps splitting the slice's rows;
// COOP > 1: several warps of one block on adjacent segments of the same rows at the same time,
// does such a line stream like a line read by one warp?). LB bytes per lane, U loads in flight
// per lane; PF: the L2 prefetch size hint of 4-byte loads (as ld_weight_word in tilec_cuda.h).
template <int LB, int WB, int COOP, int U, int PF>
__global__ void read_probe(const uint8_t* __restrict__ q, int64_t NB, int64_t slice, uint32_t* out) {
    constexpr int LPR = WB / LB, RPI = 32 / LPR;  // lanes per row, rows per load instruction
    typedef typename Vec<LB>::T V;
    const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t ncb = NB / (WB * COOP), cb = blockIdx.x % ncb, ks = blockIdx.x / ncb;
    const int64_t per = slice / (warps / COOP);
    const int64_t r0 = ks * slice + (warp / COOP) * per + lane / LPR;
    const uint8_t* p = q + r0 * NB + cb * (WB * COOP) + (warp % COOP) * WB + (lane % LPR) * LB;
    uint32_t acc = 0;
    for (int64_t r = 0; r < per; r += RPI * U) {
        V v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if constexpr (LB == 4 && PF > 0) v[u] = ld_pf<PF>(p + (r + u * RPI) * NB);
            else v[u] = *reinterpret_cast<const V*>(p + (r + u * RPI) * NB);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= Vec<LB>::fold(v[u]);
    }
    if (acc == 0x9e3779b9u) out[threadIdx.x] = acc;  // keeps the loads; (almost) never true
}

template <int LB, int WB, int COOP, int U, int PF = 0>
static int launch_coop(const uint8_t* q, int64_t NB, int64_t K, int slices, int threads, uint32_t* out,
                       cudaStream_t s) {
    const int64_t blocks = NB / (WB * COOP) * slices;
    read_probe<LB, WB, COOP, U, PF><<<(unsigned)blocks, threads, 0, s>>>(q, NB, K / slices, out);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

template <int LB, int WB, int U, int PF = 0>
static int launch_read(const uint8_t* q, int64_t NB, int64_t K, int slices, int threads, uint32_t* out,
                       cudaStream_t s) {
    return launch_coop<LB, WB, 1, U, PF>(q, NB, K, slices, threads, out, s);
}

// The same reads staged per warp through shared memory by cp.async (16 bytes per lane, WB = 128
// bytes per row, chunks of 16 rows, D chunks in flight), then read back by 4 LDS.128 per lane
// (rows 2c, 2c + 1, 2c + 8, 2c + 9 of the chunk, bytes 16g .. of the row: the mma layout of a GEMV
// whose lane g owns 32 columns), rows padded to 144 bytes (no bank conflicts). Each warp takes
// `per` rows of its block's K slice.
template <int D>
__global__ void stage_probe(const uint8_t* __restrict__ q, int64_t NB, int64_t slice, uint32_t* out) {
    constexpr int WB = 128, ROW = 144, CH = 16;
    extern __shared__ __align__(16) uint8_t smem[];
    const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    uint8_t* mine = smem + warp * D * CH * ROW;
    const int64_t ncb = NB / WB, cb = blockIdx.x % ncb, ks = blockIdx.x / ncb;
    const int64_t per = slice / warps, r0 = ks * slice + warp * per;
    const int n = (int)(per / CH);
    // copies: lane l takes 16 bytes (l % 8) of rows l / 8, + 4, + 8, + 12 of a chunk
    const uint8_t* src = q + (r0 + lane / 8) * NB + cb * WB + (lane % 8) * 16;
    auto issue = [&](int c) {
        uint8_t* dst = mine + (c % D) * CH * ROW + (lane / 8) * ROW + (lane % 8) * 16;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst + i * 4 * ROW);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d),
                         "l"(src + ((int64_t)c * CH + i * 4) * NB));
        }
        asm volatile("cp.async.commit_group;");
    };
#pragma unroll
    for (int c = 0; c < D - 1; ++c) {
        if (c < n) issue(c);
        else asm volatile("cp.async.commit_group;");
    }
    const int g = lane >> 2, cc = lane & 3;
    uint32_t acc = 0;
    for (int c = 0; c < n; ++c) {
        if (c + D - 1 < n) issue(c + D - 1);
        else asm volatile("cp.async.commit_group;");
        asm volatile("cp.async.wait_group %0;" :: "n"(D - 1));
        __syncwarp();
        const uint8_t* b = mine + (c % D) * CH * ROW + g * 16;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = 2 * cc + (e & 1) + (e >> 1) * 8;
            const uint4 v = *reinterpret_cast<const uint4*>(b + r * ROW);
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
        __syncwarp();  // the slot is refilled by the copies issued in the next iteration
    }
    if (acc == 0x9e3779b9u) out[threadIdx.x] = acc;
}

template <int D>
static int launch_stage(const uint8_t* q, int64_t NB, int64_t K, int slices, int threads, uint32_t* out,
                        cudaStream_t s) {
    const int smem = threads / 32 * D * 16 * 144;
    if (cudaFuncSetAttribute(stage_probe<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
        return 1;
    stage_probe<D><<<(unsigned)(NB / 128 * slices), threads, smem, s>>>(q, NB, K / slices, out);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

// ---- RMSNorm, C = 8192, 256 threads, f16 in and out, f32 sums -------------------------------
constexpr int RC = 8192, RT = 256, RQ = RC / (RT * 8);  // 4 16-byte groups per thread

__device__ __forceinline__ float block_sum(float v, float* scratch) {
#pragma unroll
    for (int m = 16; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    float r = scratch[0];
#pragma unroll
    for (int w = 1; w < RT / 32; ++w) r += scratch[w];
    __syncthreads();
    return r;
}

template <int Q> __device__ __forceinline__ float sumsq(const uint4 (&x)[Q]) {
    float s = 0.0f;
#pragma unroll
    for (int q = 0; q < Q; ++q) {
        const __half2* h = reinterpret_cast<const __half2*>(&x[q]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float2 f = __half22float2(h[e]);
            s = s + f.x * f.x;
            s = s + f.y * f.y;
        }
    }
    return s;
}

__device__ __forceinline__ uint4 scale8(uint4 x, uint4 w, float v) {
    uint4 y;
    const __half2* hx = reinterpret_cast<const __half2*>(&x);
    const __half2* hw = reinterpret_cast<const __half2*>(&w);
    __half2* hy = reinterpret_cast<__half2*>(&y);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float2 fx = __half22float2(hx[e]), fw = __half22float2(hw[e]);
        hy[e] = __floats2half2_rn(fx.x * v * fw.x, fx.y * v * fw.y);
    }
    return y;
}

template <int VARIANT>
__device__ __forceinline__ void rms_rows(const __half* __restrict__ X, const uint4* wv, float eps,
                                         __half* __restrict__ Y, int64_t R, uint4 (&x)[RQ],
                                         uint4 (&wr)[RQ], float* scratch);

// VARIANT 0: as tilec generates it (w loaded after the reduction); 1: w loaded with the row;
// 2: persistent blocks, w loaded once per block; 3: 2 + the next row's loads issued before this
// row's reduction; 4 and 5: rms_two_pass<0> and <1> below.
template <int VARIANT>
__global__ void __launch_bounds__(RT) rms_probe(const __half* __restrict__ X, const __half* __restrict__ w,
                                                float eps, __half* __restrict__ Y, int64_t R) {
    __shared__ float scratch[RT / 32];
    const int t = threadIdx.x;
    const uint4* wv = reinterpret_cast<const uint4*>(w);
    uint4 x[RQ], wr[RQ];
    if constexpr (VARIANT <= 1) {
        const int64_t row = blockIdx.x;
        const uint4* xv = reinterpret_cast<const uint4*>(X + row * RC);
#pragma unroll
        for (int q = 0; q < RQ; ++q) x[q] = xv[t + q * RT];
        if (VARIANT == 1) {
#pragma unroll
            for (int q = 0; q < RQ; ++q) wr[q] = wv[t + q * RT];
        }
        const float v = 1.0f / sqrtf(block_sum(sumsq(x), scratch) / (float)RC + eps);
        if (VARIANT == 0) {
#pragma unroll
            for (int q = 0; q < RQ; ++q) wr[q] = wv[t + q * RT];
        }
        uint4* yv = reinterpret_cast<uint4*>(Y + row * RC);
#pragma unroll
        for (int q = 0; q < RQ; ++q) yv[t + q * RT] = scale8(x[q], wr[q], v);
    } else {
        rms_rows<VARIANT>(X, wv, eps, Y, R, x, wr, scratch);
    }
}

// rms_probe's persistent variants (2, 3): w held per block, rows strided by the grid
template <int VARIANT>
__device__ __forceinline__ void rms_rows(const __half* __restrict__ X, const uint4* wv, float eps,
                                         __half* __restrict__ Y, int64_t R, uint4 (&x)[RQ],
                                         uint4 (&wr)[RQ], float* scratch) {
    const int t = threadIdx.x;
#pragma unroll
    for (int q = 0; q < RQ; ++q) wr[q] = wv[t + q * RT];
    int64_t row = blockIdx.x;
    if (row < R) {
        const uint4* xv = reinterpret_cast<const uint4*>(X + row * RC);
#pragma unroll
        for (int q = 0; q < RQ; ++q) x[q] = xv[t + q * RT];
    }
    for (; row < R; row += gridDim.x) {
        uint4 nx[RQ];
        const int64_t next = row + gridDim.x;
        if (VARIANT == 3 && next < R) {
            const uint4* xv = reinterpret_cast<const uint4*>(X + next * RC);
#pragma unroll
            for (int q = 0; q < RQ; ++q) nx[q] = xv[t + q * RT];
        }
        const float v = 1.0f / sqrtf(block_sum(sumsq(x), scratch) / (float)RC + eps);
        uint4* yv = reinterpret_cast<uint4*>(Y + row * RC);
#pragma unroll
        for (int q = 0; q < RQ; ++q) yv[t + q * RT] = scale8(x[q], wr[q], v);
        if (next < R) {
            if (VARIANT == 3) {
#pragma unroll
                for (int q = 0; q < RQ; ++q) x[q] = nx[q];
            } else {
                const uint4* xv = reinterpret_cast<const uint4*>(X + next * RC);
#pragma unroll
                for (int q = 0; q < RQ; ++q) x[q] = xv[t + q * RT];
            }
        }
    }
}

// Two passes over the row, as torch.compile's Triton kernel does it: the sum of squares, then
// the row read again (from L2) for the output. HINTS 0: plain loads; 1: Triton's cache hints (the
// first read kept in L2 with evict_last, the second evict_first, w evict_last). The loads are
// volatile asm so the compiler cannot reuse the first pass's registers for the second.
__device__ __forceinline__ uint4 ld16(const void* p, uint64_t pol, bool hint) {
    uint4 v;
    if (hint)
        asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
    else
        asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// a 16-byte store with an L2 cache policy
__device__ __forceinline__ void st16(void* p, uint4 v, uint64_t pol) {
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, %5;"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(pol) : "memory");
}

template <int HINTS>
__global__ void __launch_bounds__(RT) rms_two_pass(const __half* __restrict__ X, const __half* __restrict__ w,
                                                   float eps, __half* __restrict__ Y, int64_t R) {
    __shared__ float scratch[RT / 32];
    const int t = threadIdx.x;
    uint64_t keep = 0, drop = 0;
    if (HINTS) {
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(drop));
    }
    const int64_t row = blockIdx.x;
    const uint4* xv = reinterpret_cast<const uint4*>(X + row * RC);
    const uint4* wv = reinterpret_cast<const uint4*>(w);
    uint4 x[RQ];
#pragma unroll
    for (int q = 0; q < RQ; ++q) x[q] = ld16(xv + t + q * RT, keep, HINTS);
    const float v = 1.0f / sqrtf(block_sum(sumsq(x), scratch) / (float)RC + eps);
    uint4* yv = reinterpret_cast<uint4*>(Y + row * RC);
#pragma unroll
    for (int q = 0; q < RQ; ++q) {
        const uint4 xr = ld16(xv + t + q * RT, drop, HINTS), wr = ld16(wv + t + q * RT, keep, HINTS);
        yv[t + q * RT] = scale8(xr, wr, v);
    }
}

// 512 threads per row at 4 blocks per SM (32 registers: the whole SM's threads resident, as
// torch.compile's Triton kernel runs): ONE_PASS 1 holds the row's 2 vectors per thread in
// registers (w loaded with them), 0 reads the row twice like rms_two_pass<1>; 2 holds the row as 1
// does with the row loaded evict_first and w evict_last, 3 as 2 with the stores evict_first too,
// 4 as 1 with the row and w loaded evict_last, 5 as 1 with plain ld.global loads (not the
// read-only path, .nc, that 1 compiles to), 6 as 4 with the row's lines put back to
// evict_normal once read (applypriority; does the priority outlive the kernel otherwise?), 7 as
// 4 with an evict_last fraction of 0.5 (half the lines evict_last, the others unchanged).
// (discard.global.L2 would drop the lines instead, but also a previous kernel's unwritten ones.)
template <int ONE_PASS>
__global__ void __launch_bounds__(512, 4) rms_512(const __half* __restrict__ X, const __half* __restrict__ w,
                                                  float eps, __half* __restrict__ Y, int64_t R) {
    constexpr int T = 512, Q = RC / (T * 8);  // 2 vectors per thread
    __shared__ float scratch[T / 32];
    const int t = threadIdx.x;
    uint64_t keep = 0, drop = 0;
    if (ONE_PASS == 7)
        asm volatile("createpolicy.fractional.L2::evict_last.L2::evict_unchanged.b64 %0, 0.5;" : "=l"(keep));
    else
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(drop));
    const int64_t row = blockIdx.x;
    const uint4* xv = reinterpret_cast<const uint4*>(X + row * RC);
    const uint4* wv = reinterpret_cast<const uint4*>(w);
    uint4 x[Q], wr[Q];
#pragma unroll
    for (int q = 0; q < Q; ++q)
        x[q] = ONE_PASS == 1 ? xv[t + q * T]
             : ld16(xv + t + q * T, ONE_PASS == 2 || ONE_PASS == 3 ? drop : keep, ONE_PASS != 5);
    if (ONE_PASS) {
#pragma unroll
        for (int q = 0; q < Q; ++q)
            wr[q] = ONE_PASS == 1 ? wv[t + q * T] : ld16(wv + t + q * T, keep, ONE_PASS != 5);
    }
    float sq = sumsq(x);
#pragma unroll
    for (int m = 16; m > 0; m /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, m);
    if (t % 32 == 0) scratch[t / 32] = sq;
    __syncthreads();
    float tot = scratch[0];
#pragma unroll
    for (int i = 1; i < T / 32; ++i) tot += scratch[i];
    const float v = 1.0f / sqrtf(tot / (float)RC + eps);
    if (ONE_PASS == 6 && t % 8 == 0) {  // one lane per 128-byte line of the row (read by now)
#pragma unroll
        for (int q = 0; q < Q; ++q)
            asm volatile("applypriority.global.L2::evict_normal [%0], 128;" :: "l"(xv + t + q * T) : "memory");
    }
    uint4* yv = reinterpret_cast<uint4*>(Y + row * RC);
#pragma unroll
    for (int q = 0; q < Q; ++q) {
        if (!ONE_PASS) {
            x[q] = ld16(xv + t + q * T, drop, true);
            wr[q] = ld16(wv + t + q * T, keep, true);
        }
        if (ONE_PASS == 3) st16(yv + t + q * T, scale8(x[q], wr[q], v), drop);
        else yv[t + q * T] = scale8(x[q], wr[q], v);
    }
}

// ---- copies of n 16-byte vectors ------------------------------------------------------------
// 0: tilec's elementwise shape (256 threads x 2 vectors per block); 1: persistent grid-stride,
// 4 vectors per thread in flight; 2-5: variant 0 with L2 cache policies: 2 the loads evict_first,
// 3 the stores evict_first, 4 both, 5 the streaming forms (ld.global.cs / st.global.cs), 6 the
// loads evict_last, 7 plain ld.global loads (variant 0's compile to the read-only path, .nc)
template <int VARIANT>
__global__ void __launch_bounds__(256) copy_probe(const uint4* __restrict__ x, uint4* __restrict__ y, int64_t n) {
    if (VARIANT == 0) {
        const int64_t i = (int64_t)blockIdx.x * 512 + threadIdx.x;
        const uint4 a = x[i], b = x[i + 256];
        y[i] = a;
        y[i + 256] = b;
        return;
    }
    if (VARIANT >= 2) {
        uint64_t drop, keep;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(drop));
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
        const int64_t i = (int64_t)blockIdx.x * 512 + threadIdx.x;
        uint4 a, b;
        if (VARIANT == 2 || VARIANT == 4) {
            a = ld16(x + i, drop, true);
            b = ld16(x + i + 256, drop, true);
        } else if (VARIANT == 7) {
            a = ld16(x + i, 0, false);
            b = ld16(x + i + 256, 0, false);
        } else if (VARIANT == 6) {
            a = ld16(x + i, keep, true);
            b = ld16(x + i + 256, keep, true);
        } else if (VARIANT == 5) {
            a = __ldcs(x + i);
            b = __ldcs(x + i + 256);
        } else {
            a = x[i];
            b = x[i + 256];
        }
        if (VARIANT == 3 || VARIANT == 4) {
            st16(y + i, a, drop);
            st16(y + i + 256, b, drop);
        } else if (VARIANT == 5) {
            __stcs(y + i, a);
            __stcs(y + i + 256, b);
        } else {
            y[i] = a;
            y[i + 256] = b;
        }
        return;
    }
    const int64_t stride = (int64_t)gridDim.x * 1024;
    for (int64_t i = (int64_t)blockIdx.x * 1024 + threadIdx.x; i < n; i += stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = x[i + u * 256];
#pragma unroll
        for (int u = 0; u < 4; ++u) y[i + u * 256] = v[u];
    }
}

extern "C" {

// config: index into the read patterns below; returns 0, 1 on a launch error, 2 if unknown
int probe_read(int config, const uint8_t* q, int64_t NB, int64_t K, uint32_t* out, cudaStream_t s) {
    switch (config) {
        case 0: return launch_read<4, 32, 8>(q, NB, K, 1, 1024, out, s);     // the GEMV's pattern
        case 1: return launch_read<4, 32, 16>(q, NB, K, 1, 1024, out, s);
        case 2: return launch_read<4, 32, 4>(q, NB, K, 1, 1024, out, s);
        case 3: return launch_read<8, 64, 8>(q, NB, K, 2, 1024, out, s);
        case 4: return launch_read<16, 128, 4>(q, NB, K, 4, 1024, out, s);
        case 5: return launch_read<16, 128, 8>(q, NB, K, 4, 1024, out, s);
        case 6: return launch_read<16, 256, 4>(q, NB, K, 8, 1024, out, s);
        case 7: return launch_read<16, 512, 4>(q, NB, K, 16, 1024, out, s);
        case 8: return launch_read<4, 32, 8>(q, NB, K, 2, 512, out, s);      // 16 warps x 2 blocks
        case 9: return launch_read<16, 128, 4>(q, NB, K, 8, 512, out, s);
        case 10: return launch_read<16, 128, 8>(q, NB, K, 8, 512, out, s);
        case 11: return launch_read<4, 32, 8>(q, NB, K, 4, 1024, out, s);     // 512 blocks of 32 warps
        case 12: return launch_stage<4>(q, NB, K, 4, 512, out, s);  // 16 warps x 128 rows each
        case 13: return launch_stage<2>(q, NB, K, 4, 512, out, s);
        case 14: return launch_stage<6>(q, NB, K, 4, 512, out, s);
        case 15: return launch_stage<4>(q, NB, K, 8, 256, out, s);  // 8 warps, 2 blocks per SM
        case 16: return launch_read<4, 32, 8, 64>(q, NB, K, 1, 1024, out, s);  // + prefetch hints
        case 17: return launch_read<4, 32, 8, 128>(q, NB, K, 1, 1024, out, s);
        case 18: return launch_read<4, 32, 8, 256>(q, NB, K, 1, 1024, out, s);
        case 19: return launch_read<4, 32, 4, 256>(q, NB, K, 1, 1024, out, s);
        case 20: return launch_read<4, 128, 8>(q, NB, K, 4, 1024, out, s);  // one warp, 4 B/lane
        case 21: return launch_coop<4, 32, 4, 8>(q, NB, K, 4, 1024, out, s);  // 4 warps per line
        case 22: return launch_coop<4, 32, 4, 8, 128>(q, NB, K, 4, 1024, out, s);
        case 23: return launch_coop<4, 32, 2, 8>(q, NB, K, 2, 1024, out, s);
        case 24: return launch_coop<4, 32, 8, 8>(q, NB, K, 8, 1024, out, s);
        case 25: return launch_coop<4, 32, 4, 8>(q, NB, K, 8, 512, out, s);
        case 26: return launch_coop<4, 32, 4, 4>(q, NB, K, 4, 1024, out, s);
        default: return 2;
    }
}

const char* probe_read_name(int config) {
    switch (config) {
        case 0: return "4 B/lane, 32 B/row, 8 loads, 32 warps, 128 blocks (the GEMV's)";
        case 1: return "4 B/lane, 32 B/row, 16 loads, 32 warps, 128 blocks";
        case 2: return "4 B/lane, 32 B/row, 4 loads, 32 warps, 128 blocks";
        case 3: return "8 B/lane, 64 B/row, 8 loads, 32 warps, 128 blocks";
        case 4: return "16 B/lane, 128 B/row, 4 loads, 32 warps, 128 blocks";
        case 5: return "16 B/lane, 128 B/row, 8 loads, 32 warps, 128 blocks";
        case 6: return "16 B/lane, 256 B/row, 4 loads, 32 warps, 128 blocks";
        case 7: return "16 B/lane, 512 B/row, 4 loads, 32 warps, 128 blocks";
        case 8: return "4 B/lane, 32 B/row, 8 loads, 16 warps, 256 blocks";
        case 9: return "16 B/lane, 128 B/row, 4 loads, 16 warps, 256 blocks";
        case 10: return "16 B/lane, 128 B/row, 8 loads, 16 warps, 256 blocks";
        case 11: return "4 B/lane, 32 B/row, 8 loads, 32 warps, 512 blocks";
        case 12: return "cp.async 16 B/lane, 128 B/row, 4 chunks of 16 rows, 16 warps, 128 blocks, LDS.128";
        case 13: return "cp.async, as above, 2 chunks";
        case 14: return "cp.async, as above, 6 chunks";
        case 15: return "cp.async, 4 chunks, 8 warps, 256 blocks";
        case 16: return "the GEMV's, loads with an L2::64B prefetch hint";
        case 17: return "the GEMV's, L2::128B prefetch";
        case 18: return "the GEMV's, L2::256B prefetch";
        case 19: return "the GEMV's with 4 loads, L2::256B prefetch";
        case 20: return "4 B/lane, 128 B/row (one warp), 8 loads, 32 warps, 128 blocks";
        case 21: return "the GEMV's lanes, 4 warps on adjacent 32 B of the same rows, 128 blocks";
        case 22: return "as 21, L2::128B prefetch";
        case 23: return "as 21, 2 warps (64 B of a row)";
        case 24: return "as 21, 8 warps (256 B of a row)";
        case 25: return "as 21, 16 warps x 256 blocks";
        case 26: return "as 21, 4 loads";
        default: return nullptr;
    }
}

int probe_rms(int variant, const __half* X, const __half* w, float eps, __half* Y, int64_t R, int blocks,
              cudaStream_t s) {
    switch (variant) {
        case 0: rms_probe<0><<<(unsigned)R, RT, 0, s>>>(X, w, eps, Y, R); break;
        case 1: rms_probe<1><<<(unsigned)R, RT, 0, s>>>(X, w, eps, Y, R); break;
        case 2: rms_probe<2><<<(unsigned)blocks, RT, 0, s>>>(X, w, eps, Y, R); break;
        case 3: rms_probe<3><<<(unsigned)blocks, RT, 0, s>>>(X, w, eps, Y, R); break;
        case 4: rms_two_pass<0><<<(unsigned)R, RT, 0, s>>>(X, w, eps, Y, R); break;
        case 5: rms_two_pass<1><<<(unsigned)R, RT, 0, s>>>(X, w, eps, Y, R); break;
        case 6: rms_512<1><<<(unsigned)R, 512, 0, s>>>(X, w, eps, Y, R); break;
        case 7: rms_512<0><<<(unsigned)R, 512, 0, s>>>(X, w, eps, Y, R); break;
        case 8: rms_512<2><<<(unsigned)R, 512, 0, s>>>(X, w, eps, Y, R); break;
        case 9: rms_512<3><<<(unsigned)R, 512, 0, s>>>(X, w, eps, Y, R); break;
        case 10: rms_512<4><<<(unsigned)R, 512, 0, s>>>(X, w, eps, Y, R); break;
        case 11: rms_512<5><<<(unsigned)R, 512, 0, s>>>(X, w, eps, Y, R); break;
        case 12: rms_512<6><<<(unsigned)R, 512, 0, s>>>(X, w, eps, Y, R); break;
        case 13: rms_512<7><<<(unsigned)R, 512, 0, s>>>(X, w, eps, Y, R); break;
        default: return 2;
    }
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

int probe_copy(int variant, const void* x, void* y, int64_t n16, int blocks, cudaStream_t s) {
    const uint4* xv = static_cast<const uint4*>(x);
    uint4* yv = static_cast<uint4*>(y);
    if (variant == 0) copy_probe<0><<<(unsigned)(n16 / 512), 256, 0, s>>>(xv, yv, n16);
    else if (variant == 1) copy_probe<1><<<(unsigned)blocks, 256, 0, s>>>(xv, yv, n16);
    else if (variant == 2) copy_probe<2><<<(unsigned)(n16 / 512), 256, 0, s>>>(xv, yv, n16);
    else if (variant == 3) copy_probe<3><<<(unsigned)(n16 / 512), 256, 0, s>>>(xv, yv, n16);
    else if (variant == 4) copy_probe<4><<<(unsigned)(n16 / 512), 256, 0, s>>>(xv, yv, n16);
    else if (variant == 5) copy_probe<5><<<(unsigned)(n16 / 512), 256, 0, s>>>(xv, yv, n16);
    else if (variant == 6) copy_probe<6><<<(unsigned)(n16 / 512), 256, 0, s>>>(xv, yv, n16);
    else if (variant == 7) copy_probe<7><<<(unsigned)(n16 / 512), 256, 0, s>>>(xv, yv, n16);
    else return 2;
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

// blocks of 256 threads of rms_probe<2> that fit on one SM
int probe_rms_occupancy(void) {
    int n = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, rms_probe<3>, RT, 0);
    return n;
}
}
