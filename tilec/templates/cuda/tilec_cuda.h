// tilec_cuda.h -- the tilec CUDA device library.
//
// Every .cu file tilec emits for the CUDA target includes this header (copied verbatim next to
// the generated sources). It needs only the CUDA runtime and sm_80 or later:
//   * f16 / bf16 / fp8 storage (raw bits) and conversions, vector loads and stores with
//     predicated tails;
//   * shared-memory tile layouts (16-byte chunks XOR-swizzled by row, or padded rows);
//   * tile copies global -> shared: 16-byte cp.async with zero-fill for the parts outside the
//     tensor, commit / wait groups, and an element-wise path for unaligned tensors;
//   * tile GEMMs: ldmatrix + mma.sync m16n8k16 (f16, bf16) from shared memory or with A in
//     registers, and a scalar FMA path for other dtypes, all with the same accumulator layout;
//   * row reductions across the threads that share a row (warp shuffles, shared memory);
//   * the elementwise math of fused expressions (NumPy semantics for NaN and integer division)
//     and the host helpers of the launchers.
// Generated code is compiled with --fmad=false (elementwise code computes exactly what the
// program says); only the matrix products here fuse multiply-adds, explicitly.
#ifndef TILEC_CUDA_H
#define TILEC_CUDA_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda.h>  // CUtensorMap and its enums (types only: no -lcuda)
#include <cuda_runtime.h>

#include "tilec_checked.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <atomic>
#include <mutex>
#include <type_traits>

#define TILEC_DEV __device__ __forceinline__
#define TILEC_HD __host__ __device__ __forceinline__

namespace tilec {

// ---- 16-bit floats: stored as raw bits (uint16_t), computed in float ----------------------
// (host and device: launchers convert 16-bit scalar arguments)
TILEC_HD float f16_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
TILEC_HD uint16_t f32_to_f16(float x) { return __half_as_ushort(__float2half_rn(x)); }
// bf16's bits are the high half of the f32's: a shift in plain code, which the compiler merges
// with the unpacking of a register that holds two (one AND for the high one)
TILEC_HD float bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
#endif
}
TILEC_HD uint16_t f32_to_bf16(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
TILEC_DEV float round_f16(float x) { return f16_to_f32(f32_to_f16(x)); }
TILEC_DEV float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// 16-bit arithmetic in 16-bit registers: an add, subtract or multiply of two f16 (bf16) values
// computed in f32 and rounded once equals the correctly rounded 16-bit operation (24 >= 2 * 11 + 2
// bits: the double rounding is innocuous), so the renderer runs such operations as one 16-bit
// instruction on the values' bits (`__hadd_rn` etc.: `_rn` keeps mul + add from fusing) instead
// of converting, computing in f32 and rounding.
TILEC_DEV __half as_f16(uint16_t b) { return __ushort_as_half(b); }
TILEC_DEV __nv_bfloat16 as_bf16(uint16_t b) { return __ushort_as_bfloat16(b); }
TILEC_DEV __half to_f16(float x) { return __float2half_rn(x); }
TILEC_DEV __nv_bfloat16 to_bf16(float x) { return __float2bfloat16_rn(x); }
TILEC_DEV float to_f32(__half h) { return __half2float(h); }
TILEC_DEV float to_f32(__nv_bfloat16 h) { return __bfloat162float(h); }
TILEC_DEV uint16_t bits(__half h) { return __half_as_ushort(h); }
TILEC_DEV uint16_t bits(__nv_bfloat16 h) { return __bfloat16_as_ushort(h); }

// ---- 8-bit floats (OCP FP8): stored as raw bits (uint8_t), computed in float ---------------
// E4M3 (no infinities; its NaN is S.1111.111; largest 448) and E5M2 (IEEE-like; largest 57344).
// Every fp8 value is an f16 value: E5M2's bits are an f16's high byte, and E4M3's, moved into
// f16's fields, are the value times 2^-8 (exponent bias 7 against 15), subnormals included.
TILEC_HD float fp8e5m2_to_f32(uint8_t c) { return f16_to_f32((uint16_t)(c << 8)); }
TILEC_HD float fp8e4m3_to_f32(uint8_t c) {
    if ((c & 0x7f) == 0x7f) return f16_to_f32((uint16_t)(0x7e00 | (c & 0x80) << 8));  // NaN
    return f16_to_f32((uint16_t)((c & 0x80) << 8 | (c & 0x7f) << 7)) * 256.0f;
}
// float -> fp8: nearest even, saturating (finite values and infinities past the range give the
// largest of their sign), NaN stays NaN: sm_89 and later convert in hardware (cvt .satfinite,
// two values per instruction); elsewhere the value, in units of the fp8 spacing at its binade
// (the subnormal spacing below the smallest normal), is rounded by rintf.
template <int E, int M>
TILEC_HD uint8_t f32_to_fp8(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint16_t r;
    if (E == 4)
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
    else
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
    return (uint8_t)r;  // (b, the second source, is the low byte)
#else
    constexpr int BIAS = (1 << (E - 1)) - 1;
    constexpr uint32_t TOP = E == 4 ? 0x7eu : 0x7bu;  // the largest finite code
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    const uint32_t sign = (u >> 24) & 0x80u, au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return (uint8_t)(sign | 0x7fu);  // NaN
    const int e = (int)(au >> 23) - 127;  // (f32 subnormals: far below fp8's range)
    if (e > BIAS + 1) return (uint8_t)(sign | TOP);  // (infinities too)
    const int q = (e < 1 - BIAS ? 1 - BIAS : e) - M;
    const uint32_t scale = (uint32_t)(127 - q) << 23;
    float fa, fs;
    std::memcpy(&fa, &au, sizeof fa);
    std::memcpy(&fs, &scale, sizeof fs);
    const uint32_t n = (uint32_t)rintf(fa * fs);
    // normal: n in [2^M, 2^(M+1)] (2^(M+1): the next binade); subnormal: n <= 2^M, the code
    const uint32_t code = e < 1 - BIAS ? n : ((uint32_t)(e + BIAS) << M) + n - (1u << M);
    return (uint8_t)(sign | (code > TOP ? TOP : code));
#endif
}
TILEC_HD uint8_t f32_to_fp8e4m3(float x) { return f32_to_fp8<4, 3>(x); }
TILEC_HD uint8_t f32_to_fp8e5m2(float x) { return f32_to_fp8<5, 2>(x); }
TILEC_DEV float round_fp8e4m3(float x) { return fp8e4m3_to_f32(f32_to_fp8e4m3(x)); }
TILEC_DEV float round_fp8e5m2(float x) { return fp8e5m2_to_f32(f32_to_fp8e5m2(x)); }

// ---- elementwise math of fused expressions: float and double overloads, NumPy semantics ------
// exp2 of f32 is the hardware's ex2 (within 2 ulp), exp goes through it (x * log2 e rounds once:
// about 2 ulp for |x| < 20, 3e-6 relative at |x| = 88); the others are the CUDA math library's
// full-precision functions. (Results below 2^-126 flush to zero: one ex2 instruction, without
// the subnormal rescaling.)
TILEC_DEV float exp2_f32(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
TILEC_DEV float exp_f32(float x) { return exp2_f32(x * 1.4426950408889634f); }
TILEC_DEV float exp(float x) { return exp_f32(x); }
TILEC_DEV float exp2(float x) { return exp2_f32(x); }
// 1 / x, correctly rounded (a row's reciprocal, computed once per row)
TILEC_DEV float recip(float x) { return __frcp_rn(x); }
// 1 / y for y in [1, 2] (sigmoid's denominator): f32 takes the hardware reciprocal (within 1 ulp,
// one instruction instead of a correctly rounded reciprocal's dozen and its slow-path call)
TILEC_DEV float recip_1_2(float y) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
    return r;
}
TILEC_DEV double recip_1_2(double y) { return __drcp_rn(y); }
// NumPy's maximum / minimum: NaN wins (for f32 one max.NaN / min.NaN instruction, sm_80+)
TILEC_DEV float maximum(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
TILEC_DEV float minimum(float a, float b) {
    float r;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

}  // namespace tilec
// the device code both GPU libraries share (16-bit fragments and storage kinds, 4-bit loads,
// elementwise math, integer division and casts, reduction operators, host checks)
#include "tilec_gpu.h"
namespace tilec {

// the storage kinds of the 8-bit floats (their conversions above)
typedef NarrowFloat<uint8_t, fp8e4m3_to_f32, f32_to_fp8e4m3> FP8E4M3;
typedef NarrowFloat<uint8_t, fp8e5m2_to_f32, f32_to_fp8e5m2> FP8E5M2;

// ---- whole-vector loads and stores (tilec_gpu.h's load_vec and store_vec call them) ---------
template <> struct Word<1> { typedef uint8_t type; };
template <> struct Word<2> { typedef uint16_t type; };
template <> struct Word<4> { typedef uint32_t type; };
template <> struct Word<8> { typedef uint2 type; };
template <> struct Word<16> { typedef uint4 type; };

// How a whole-vector load reads: LOAD_ANY, a generic address (global or shared memory); the other
// two take global memory only. LOAD_ONCE: memory the kernel reads once (an elementwise kernel's
// input the shape of its output): 16-byte words load evict-first (ld.global.cs), leaving L2 to
// what is reused (measured on the H200: a 4-op f16 chain 0.281 -> 0.268 ms). LOAD_GLOBAL: any
// other global input, loaded as LOAD_ANY unless TILEC_LOAD_FORM says otherwise.
// (TILEC_LOAD_FORM, a measurement macro: 0, the default, as above; 1 LOAD_GLOBAL as plain
// ld.global (not the read-only path, .nc); 2 LOAD_GLOBAL with an L2 evict_last policy; 3 as 2,
// and LOAD_ONCE as LOAD_GLOBAL. Measured on the H200, 32768 x 8192 f16 (512 MiB read, 512 MiB
// written): form 2 takes softmax from 4105 to 4270 GB/s and RMSNorm from 4096 to 4261 (a copy
// 4097 -> 4279; torch.compile's RMSNorm, which loads its rows evict_last, 4279), form 3 the 4-op
// chain from 4058 to 4241; plain and evict-first loads were no faster (4134, 3943). It is not the
// default because of what it leaves behind: the evict_last lines outlive the kernel and outrank
// every later kernel's lines in L2. Eight 16 MiB copies (which fit in L2) took 72.7 us after such
// a kernel, 59.9 after the same kernel with plain loads, more than the 9 us it saves. A probe
// that puts its row's lines back to evict_normal once read kept half the gain and left nothing
// behind: docs/PERFORMANCE.md.)
#ifndef TILEC_LOAD_FORM
#define TILEC_LOAD_FORM 0
#endif
template <int V, class K, LoadHint H>
TILEC_DEV void load_vec_whole(typename K::reg (&out)[V], const typename K::storage* p) {
    typedef typename K::storage S;
    typedef typename VecWord<V * sizeof(S)>::type W;
    constexpr int NW = V * sizeof(S) / sizeof(W);
    constexpr bool WORDS16 = sizeof(W) == 16;
    constexpr bool ONCE = H == LOAD_ONCE && TILEC_LOAD_FORM != 3 && WORDS16;
    constexpr bool KEEP = H != LOAD_ANY && !ONCE && TILEC_LOAD_FORM >= 1 && WORDS16;
    union { W w[NW]; S s[V]; } u;
    uint64_t policy = 0;
    if constexpr (KEEP && TILEC_LOAD_FORM >= 2)
        asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
#pragma unroll
    for (int i = 0; i < NW; ++i) {
        if constexpr (ONCE) {
            u.w[i] = __ldcs(reinterpret_cast<const uint4*>(p) + i);
        } else if constexpr (KEEP) {
            const uint4* q = reinterpret_cast<const uint4*>(p) + i;
            uint4 v;
            if constexpr (TILEC_LOAD_FORM >= 2)
                asm("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                    : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(q), "l"(policy));
            else
                asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                    : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(q));
            std::memcpy(&u.w[i], &v, sizeof(v));
        } else {
            u.w[i] = reinterpret_cast<const W*>(p)[i];
        }
    }
    (void)policy;
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = K::load(u.s[v]);
}
template <int V, class K>
TILEC_DEV void store_vec_whole(typename K::storage* p, const typename K::reg (&in)[V]) {
    typedef typename K::storage S;
    typedef typename VecWord<V * sizeof(S)>::type W;
    constexpr int NW = V * sizeof(S) / sizeof(W);
    if constexpr (sizeof(S) < 4 && sizeof(W) >= 4) {
        // narrow values: packed into 32-bit words by shifts and stored as one access of
        // sizeof(W) bytes (a generic-address store: the pointer may be global or shared)
        typedef typename Word<sizeof(S)>::type U;  // (bool, signed types: their bits)
        constexpr int PER = 4 / (int)sizeof(S), NU = V / PER, UW = (int)sizeof(W) / 4;
        uint32_t u[NU];
#pragma unroll
        for (int i = 0; i < NU; ++i) {
            u[i] = 0;
#pragma unroll
            for (int e = 0; e < PER; ++e)
                u[i] |= (uint32_t)(U)K::store(in[i * PER + e]) << (8 * (int)sizeof(S) * e);
        }
#pragma unroll
        for (int i = 0; i < NW; ++i) {
            W* q = reinterpret_cast<W*>(p) + i;
            if constexpr (UW == 4) {  // (a uint4 assignment was split into 32-bit stores)
                asm volatile("st.v4.b32 [%0], {%1, %2, %3, %4};\n" :: "l"(q), "r"(u[4 * i]),
                             "r"(u[4 * i + 1]), "r"(u[4 * i + 2]), "r"(u[4 * i + 3]) : "memory");
            } else if constexpr (UW == 2) {
                asm volatile("st.v2.b32 [%0], {%1, %2};\n" :: "l"(q), "r"(u[2 * i]), "r"(u[2 * i + 1])
                             : "memory");
            } else {
                *reinterpret_cast<uint32_t*>(q) = u[i];
            }
        }
    } else {
        union { W w[NW]; S s[V]; } u;
#pragma unroll
        for (int v = 0; v < V; ++v) u.s[v] = K::store(in[v]);
#pragma unroll
        for (int i = 0; i < NW; ++i) reinterpret_cast<W*>(p)[i] = u.w[i];
    }
}


// ---- dequantization of 4-bit weights, eight values per call ------------------------------------
// out[v] = H((q_v - zero) * s_v) for the eight values of the 32-bit word w (value v in bits 4v..4v+3,
// as a packed row stores them), each product rounded once: the same bits as the f32 expression
// rounded to H. Two values per instruction: a byte permute of (w, w >> 4) and one LOP3 put q_2p
// and q_2p+1 (bits 0-3 and 16-19) into the mantissas of MAGIC (whose ulp is 1) in the two halves
// of a register, subtracting MAGIC + zero leaves q - zero exactly, and a product of two 16-bit
// values is exact in f32, so the 16-bit multiply rounds it as the f32 expression's conversion
// does. `bias` is the 16-bit pair (MAGIC + zero [+ 8 for signed values, whose sign bit is
// flipped]) in both halves.
template <class H> struct Pair16;
template <> struct Pair16<F16> {
    typedef __half2 type;
    static constexpr uint32_t magic = 0x64006400u;  // 1024.0 in both halves
    // the low (high) half of a pair in both halves (an operand selector of the 16-bit
    // instruction that reads it, not an instruction)
    static TILEC_DEV uint32_t lows(uint32_t x) { return bits(__low2half2(pair(x))); }
    static TILEC_DEV uint32_t highs(uint32_t x) { return bits(__high2half2(pair(x))); }
    static TILEC_DEV type pair(uint32_t x) { return *reinterpret_cast<const type*>(&x); }
    static TILEC_DEV uint32_t bits(type x) { return *reinterpret_cast<const uint32_t*>(&x); }
};
template <> struct Pair16<BF16> {
    typedef __nv_bfloat162 type;
    static constexpr uint32_t magic = 0x43004300u;  // 128.0 in both halves
    static TILEC_DEV uint32_t lows(uint32_t x) { return bits(__low2bfloat162(pair(x))); }
    static TILEC_DEV uint32_t highs(uint32_t x) { return bits(__high2bfloat162(pair(x))); }
    static TILEC_DEV type pair(uint32_t x) { return *reinterpret_cast<const type*>(&x); }
    static TILEC_DEV uint32_t bits(type x) { return *reinterpret_cast<const uint32_t*>(&x); }
};
// The pair H((q_lo - zero) * s_lo), H((q_hi - zero) * s_hi) of the nibbles in bits 0-3 and
// 16-19 of `nibbles` (other bits ignored) and the scales in the halves of `scales`: the mask and
// MAGIC in one LOP3 (0xEA: (a & b) | c), then the exact subtraction of `bias` and the product.
template <class H> TILEC_DEV uint32_t dequant_pair(uint32_t nibbles, uint32_t bias, uint32_t scales) {
    typedef typename Pair16<H>::type P;
    uint32_t x;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(x)
        : "r"(nibbles), "n"(0x000f000f), "r"(Pair16<H>::magic));
    P v = __hsub2_rn(*reinterpret_cast<const P*>(&x), *reinterpret_cast<const P*>(&bias));
    v = __hmul2_rn(v, *reinterpret_cast<const P*>(&scales));
    return *reinterpret_cast<const uint32_t*>(&v);
}
template <class H, bool SIGNED>
TILEC_DEV void dequant4x8(uint16_t (&out)[8], uint32_t w, uint32_t bias, const uint16_t (&s)[8]) {
    if (SIGNED) w ^= 0x88888888u;  // q + 8 for two's complement nibbles
    const uint32_t hi = w >> 4;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        // bytes [w.byte p, -, (w >> 4).byte p, -]: nibble 2p in the low half, 2p + 1 in the high
        const uint32_t r = dequant_pair<H>(
            __byte_perm(w, hi, p | (p << 4) | ((p + 4) << 8) | ((p + 4) << 12)), bias,
            (uint32_t)s[2 * p] | ((uint32_t)s[2 * p + 1] << 16));
        out[2 * p] = (uint16_t)r;
        out[2 * p + 1] = (uint16_t)(r >> 16);
    }
}

// V consecutive 4-bit values of row `row` from column col0 (n valid) of a packed [.., cols]
// tensor: one V/2-byte load when col0 is even and the bytes are aligned, else value by value.
template <int V, bool SIGNED>
TILEC_DEV void load_vec4(int32_t (&out)[V], const uint8_t* base, int64_t row, int64_t col0,
                         int64_t cols, int64_t n) {
    const uint8_t* p = base + row * ((cols + 1) >> 1) + (col0 >> 1);
    typedef typename VecWord<(V / 2 > 0 ? V / 2 : 1)>::type W;
    if (V % 2 == 0 && n >= V && (col0 & 1) == 0 && (reinterpret_cast<uintptr_t>(p) % sizeof(W)) == 0 &&
        sizeof(W) * 2 == V) {
        union { W w; uint8_t b[sizeof(W)]; } u;
        u.w = *reinterpret_cast<const W*>(p);
#pragma unroll
        for (int v = 0; v < V; ++v) {
            const int32_t q = (u.b[v / 2] >> ((v & 1) * 4)) & 15;
            out[v] = SIGNED ? (q ^ 8) - 8 : q;
        }
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v)
            out[v] = v < n ? (SIGNED ? load_i4(base, row, col0 + v, cols) : load_u4(base, row, col0 + v, cols)) : 0;
    }
}

// ---- shared-memory tile layouts: element (r, c) of a ROWS x COLS tile ------------------------
// Swizzled: the 16-byte chunks of row r are XOR-permuted by r, so that the 8 rows an ldmatrix
// (or 8 lanes of a cp.async) touch at one column land in 8 different bank groups. Rows of 1, 2
// or 4 chunks XOR with r/8, r/4 or r/2: 8 consecutive rows then still cover all 8 positions of
// a 128-byte line.
template <int ROWS, int COLS, typename T> struct SwizzledTile {
    static constexpr int E = 16 / (int)sizeof(T);  // elements per 16-byte chunk
    static constexpr int CPR = COLS / E;           // chunks per row
    static constexpr int S = CPR < 8 ? CPR : 8;    // positions the XOR permutes
    static constexpr int REP = 8 / S;              // consecutive rows sharing one permutation
    static constexpr int size = ROWS * COLS;
    static constexpr int PERIOD = 8;  // offset(r + 8, c) == offset(r, c) + 8 * STRIDE
    static constexpr int STRIDE = COLS;
    static_assert(COLS % E == 0 && (CPR % 8 == 0 || CPR == 1 || CPR == 2 || CPR == 4),
                  "a swizzled row is 1, 2, 4 or a multiple of 8 chunks of 16 bytes");
    static TILEC_DEV int offset(int r, int c) {
        return r * COLS + (((c / E) ^ ((r / REP) % S)) * E) + (c % E);
    }
    // offset(r + dr, c + dc) from o = offset(r, c), for dr a multiple of 8 (the XOR pattern
    // repeats) and dc a multiple of E whose chunk bits below S are clear in c's chunk: the
    // chunk index then XORs with dc's low bits and adds its high ones. With constant steps: one
    // XOR and a constant (the shared-memory instruction's immediate), so a K loop keeps one
    // base offset per thread instead of recomputing the swizzle of every fragment address.
    static TILEC_DEV int advance(int o, int dr, int dc) {
        return (o ^ (((dc / E) % S) * E)) + dr * COLS + (dc / E / S) * S * E;
    }
    // whether 16 bytes along a row, from a column that is a multiple of E, are consecutive and
    // aligned (one vector load): the XOR moves whole chunks
    static constexpr bool ROW_CHUNKS = true;
};
template <int ROWS, int COLS, int PAD, typename T> struct PaddedTile {
    static constexpr int size = ROWS * (COLS + PAD);
    static constexpr int PERIOD = 1;  // offset(r + 1, c) == offset(r, c) + STRIDE
    static constexpr int STRIDE = COLS + PAD;
    static TILEC_DEV int offset(int r, int c) { return r * (COLS + PAD) + c; }
    static TILEC_DEV int advance(int o, int dr, int dc) { return o + dr * (COLS + PAD) + dc; }
    static constexpr bool ROW_CHUNKS = (COLS + PAD) * sizeof(T) % 16 == 0;
};

// ---- cp.async --------------------------------------------------------------------------------
TILEC_DEV uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// The L2 prefetch size hint of the tile copies (a measurement knob, e.g. `make
// NVCCFLAGS="-O3 -DTILEC_CP_ASYNC_PREFETCH=256"`, 64 or 256; without it ptxas asks for 128 bytes)
#define TILEC_STR_(x) #x
#define TILEC_STR(x) TILEC_STR_(x)
#ifdef TILEC_CP_ASYNC_PREFETCH
#define TILEC_CP_ASYNC_L2 ".L2::" TILEC_STR(TILEC_CP_ASYNC_PREFETCH) "B"
#else
#define TILEC_CP_ASYNC_L2 ""
#endif

// 16 bytes global -> shared, of which the first `src_bytes` are read and the rest zero-filled.
TILEC_DEV void cp_async16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global" TILEC_CP_ASYNC_L2 " [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(src_bytes) : "memory");
}
// ... and all 16 bytes read (a chunk known to lie inside the tensor)
TILEC_DEV void cp_async16_whole(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global" TILEC_CP_ASYNC_L2 " [%0], [%1], 16;\n"
                 :: "r"(dst), "l"(src) : "memory");
}
// W = 4 or 8 bytes global -> shared (through L1: cp.async takes narrow copies as .ca only), the
// first `src_bytes` read and the rest zero-filled: the copies of rows that are not 16-byte aligned
template <int W> TILEC_DEV void cp_async_narrow(uint32_t dst, const void* src, int src_bytes) {
    static_assert(W == 4 || W == 8, "cp.async copies 4, 8 or 16 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
                 :: "r"(dst), "l"(src), "n"(W), "r"(src_bytes) : "memory");
}
TILEC_DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> TILEC_DEV void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// What a thread's share of copying windows of a tensor in a loop needs (copy_g2s_inside),
// computed once per kernel instead of at every copy: the offset of the thread's first chunk
// inside a window (row stride `ld`), its first chunk's place in the shared tile, and whether
// 16-byte chunks can be read at all (aligned tensor and row stride: part of the loop's test).
template <int ROWS, int COLS, int THREADS, class L, typename T> struct CopyPlan {
    static constexpr int E = 16 / (int)sizeof(T), CPR = COLS / E;
    static constexpr int RS = THREADS % CPR == 0 ? THREADS / CPR : 0;  // rows per round of chunks
    static constexpr int ITERS = (ROWS * CPR + THREADS - 1) / THREADS;
    static constexpr bool STRIDED = COLS % E == 0 && RS > 0 && RS % L::PERIOD == 0 &&
                                    (ROWS * CPR) % THREADS == 0;
    int64_t thread_off;
    uint32_t dst_off;  // bytes
    bool chunks;
    TILEC_DEV CopyPlan(const T* tensor, int64_t ld) {
        const int tid = threadIdx.x, r0 = STRIDED ? tid / CPR : 0, k = STRIDED ? (tid % CPR) * E : 0;
        thread_off = (int64_t)r0 * ld + k;
        dst_off = (uint32_t)(L::offset(r0, k) * (int)sizeof(T));
        chunks = COLS % E == 0 && ld % E == 0 && (reinterpret_cast<uintptr_t>(tensor) % 16) == 0;
    }
};
template <int ROWS, int COLS, int THREADS, class L, typename T>
TILEC_DEV CopyPlan<ROWS, COLS, THREADS, L, T> copy_plan(const T* tensor, int64_t ld) {
    return CopyPlan<ROWS, COLS, THREADS, L, T>(tensor, ld);
}

// The widest narrow copy (8 or 4 bytes; 0: none) that the rows of a window at `src` (row stride
// `ld` elements) allow when 16-byte chunks do not: the window's start and the row stride
// multiples of it, the tile's rows a whole number of copies, and each copy's bytes consecutive
// in the shared layout (they lie in one of its 16-byte chunks: swizzles move whole chunks) and
// aligned there (the layout's row stride a multiple of it).
// (`make NVCCFLAGS="-O3 -DTILEC_NARROW_COPIES=0"`: element by element instead, for measuring)
#ifndef TILEC_NARROW_COPIES
#define TILEC_NARROW_COPIES 1
#endif
template <int COLS, class L, typename T>
TILEC_DEV int copy_narrow_width(const T* src, int64_t ld) {
    if (!TILEC_NARROW_COPIES) return 0;
    const uint64_t bits = reinterpret_cast<uintptr_t>(src) | (uint64_t)ld * sizeof(T);
#pragma unroll
    for (int w = 8; w >= 4; w /= 2)
        if (w >= (int)sizeof(T) && (COLS * (int)sizeof(T)) % w == 0 &&
            (L::STRIDE * (int)sizeof(T)) % w == 0 && bits % w == 0)
            return w;
    return 0;
}
// copy_g2s of a window whose rows allow W-byte copies only (copy_narrow_width): each thread
// issues its copies through cp.async (asynchronous, like the 16-byte path's), a copy cut by the
// tensor's edge reading its part and zero-filling the rest, one outside it zero-filling all.
template <int W, int ROWS, int COLS, int THREADS, class L, typename T>
TILEC_DEV void copy_g2s_width(T* dst, const T* src, int64_t ld, int64_t nr, int64_t nc) {
    constexpr int E = W / (int)sizeof(T), CPR = COLS / E, ITERS = (ROWS * CPR + THREADS - 1) / THREADS;
    // (a loop, not unrolled: beside a tensor-core kernel's accumulators, up to 32 copies a thread
    // unrolled took registers enough to spill)
#pragma unroll 1
    for (int it = 0; it < ITERS; ++it) {
        const int c = (int)threadIdx.x + it * THREADS;
        if (ROWS * CPR % THREADS != 0 && c >= ROWS * CPR) break;
        const int r = c / CPR, k = (c % CPR) * E;
        const bool in = r < nr && k < nc;
        const int bytes = in ? (int)(nc - k < E ? nc - k : E) * (int)sizeof(T) : 0;
        cp_async_narrow<W>(smem_addr(dst + L::offset(r, k)), in ? src + (int64_t)r * ld + k : src, bytes);
    }
}
// The narrow copies of a window (asynchronous ones only), at the widest width its rows allow;
// false where none does (copied element by element then)
template <bool ASYNC, int ROWS, int COLS, int THREADS, class L, typename T>
TILEC_DEV bool copy_g2s_narrow(T* dst, const T* src, int64_t ld, int64_t nr, int64_t nc) {
    if constexpr (ASYNC && sizeof(T) <= 8) {
        const int w = copy_narrow_width<COLS, L, T>(src, ld);
        if (w == 8) {
            copy_g2s_width<8, ROWS, COLS, THREADS, L>(dst, src, ld, nr, nc);
            return true;
        }
        if constexpr (sizeof(T) <= 4) {
            if (w == 4) {
                copy_g2s_width<4, ROWS, COLS, THREADS, L>(dst, src, ld, nr, nc);
                return true;
            }
        }
    }
    return false;
}

// Copy the ROWS x COLS window at `src` (row stride `ld` elements; the first nr rows and nc
// columns of it lie inside the tensor) into the shared tile `dst` of layout L; the rest of the
// tile is zero. THREADS threads call it together; each moves whole 16-byte chunks, in a fully
// unrolled loop. With ASYNC the chunks go through cp.async (complete after cp_async_wait), a
// chunk outside the tensor being zero-filled without reading memory. A chunk cut by the tensor's
// edge is copied element by element; rows that are not 16-byte aligned go 8 or 4 bytes at a time
// through cp.async where they allow it (copy_g2s_narrow), else element by element too. WHOLE:
// the window's column offset is a multiple of a chunk, so with aligned rows no chunk is cut.
// NARROW false: no narrow copies (value by value instead), where the renderer keeps the
// loops as they were measured without them (targets/cuda.py copy_call).
template <int ROWS, int COLS, int THREADS, class L, bool ASYNC, bool WHOLE, bool NARROW = true,
          typename T>
TILEC_DEV void copy_g2s(T* dst, const T* src, int64_t ld, int64_t nr, int64_t nc) {
    constexpr int E = 16 / (int)sizeof(T);
    constexpr int CPR = COLS / E;                    // chunks per row
    constexpr int ITERS = (ROWS * CPR + THREADS - 1) / THREADS;
    // each iteration moves the next RS rows; the thread's chunk keeps its column, so its source
    // advances by RS rows and (with RS a multiple of the layout's period) its destination too
    constexpr int RS = THREADS % CPR == 0 ? THREADS / CPR : 0;
    constexpr bool STRIDED = RS > 0 && RS % L::PERIOD == 0 && (ROWS * CPR) % THREADS == 0;
    const int tid = threadIdx.x;
    const bool chunks = COLS % E == 0 && ld % E == 0 && (reinterpret_cast<uintptr_t>(src) % 16) == 0;
    if (chunks && STRIDED && nr >= ROWS && nc >= COLS) {
        // the whole window lies inside the tensor (most tiles): no tests; the thread's source
        // advances by RS rows per chunk, its destination by a constant offset
        const int r0 = tid / CPR, k = (tid % CPR) * E;
        const T* s = src + (int64_t)r0 * ld + k;
        const int64_t step = (int64_t)RS * ld;
        T* const d0 = dst + L::offset(r0, k);
        const uint32_t a0 = smem_addr(d0);
#pragma unroll
        for (int it = 0; it < ITERS; ++it, s += step) {
            if (ASYNC) {
                cp_async16_whole(a0 + it * RS * L::STRIDE * (int)sizeof(T), s);
            } else {
                *reinterpret_cast<uint4*>(d0 + it * RS * L::STRIDE) = *reinterpret_cast<const uint4*>(s);
            }
        }
        return;
    }
    if (chunks) {
        const int r0 = tid / CPR, k = (tid % CPR) * E;
        const bool col_in = k < nc, col_whole = k + E <= nc;
        T* const d0 = dst + L::offset(r0, k);
        const T* const s0 = src + (int64_t)r0 * ld + k;
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
            const int c = tid + it * THREADS;
            if (!STRIDED && c >= ROWS * CPR) break;
            const int r = STRIDED ? r0 + it * RS : c / CPR;
            const int kk = STRIDED ? k : (c % CPR) * E;
            T* d = STRIDED ? d0 + it * RS * L::STRIDE : dst + L::offset(r, kk);
            const T* s = STRIDED ? s0 + (int64_t)(it * RS) * ld : src + (int64_t)r * ld + kk;
            const bool in = r < nr && (STRIDED ? col_in : kk < nc);
            if (WHOLE || !in || (STRIDED ? col_whole : kk + E <= nc)) {  // a whole chunk, or none
                if (ASYNC) {
                    cp_async16(d, in ? s : src, in ? 16 : 0);
                } else {
                    *reinterpret_cast<uint4*>(d) = in ? *reinterpret_cast<const uint4*>(s) : make_uint4(0, 0, 0, 0);
                }
            } else {
#pragma unroll
                for (int e = 0; e < E; ++e) d[e] = kk + e < nc ? s[e] : T(0);
            }
        }
    } else if (!copy_g2s_narrow<ASYNC && NARROW, ROWS, COLS, THREADS, L>(dst, src, ld, nr, nc)) {
        for (int e = tid; e < ROWS * COLS; e += THREADS) {
            const int r = e / COLS, c = e % COLS;
            dst[L::offset(r, c)] = (r < nr && c < nc) ? src[(int64_t)r * ld + c] : T(0);
        }
    }
}

// copy_g2s of a window known to lie inside the tensor, whose plan says chunks can be read (both
// tested once, before the loop that copies): no tests at all.
template <bool ASYNC, int ROWS, int COLS, int THREADS, class L, typename T>
TILEC_DEV void copy_g2s_inside(const CopyPlan<ROWS, COLS, THREADS, L, T>& plan, T* dst, const T* src,
                               int64_t ld) {
    typedef CopyPlan<ROWS, COLS, THREADS, L, T> P;
    if (!P::STRIDED) {  // chunks do not keep their column from round to round: each its own
#pragma unroll
        for (int it = 0; it < P::ITERS; ++it) {
            const int c = (int)threadIdx.x + it * THREADS, r = c / P::CPR, k = (c % P::CPR) * P::E;
            if (c >= ROWS * P::CPR) break;
            if (ASYNC) {
                cp_async16_whole(smem_addr(dst + L::offset(r, k)), src + (int64_t)r * ld + k);
            } else {
                *reinterpret_cast<uint4*>(dst + L::offset(r, k)) =
                    *reinterpret_cast<const uint4*>(src + (int64_t)r * ld + k);
            }
        }
        return;
    }
    const T* s = src + plan.thread_off;
    const uint32_t a0 = smem_addr(dst) + plan.dst_off;
#pragma unroll
    for (int it = 0; it < P::ITERS; ++it, s += P::RS * ld) {
        if (ASYNC) {
            cp_async16_whole(a0 + it * P::RS * L::STRIDE * (int)sizeof(T), s);
        } else {
            *reinterpret_cast<uint4*>(dst + plan.dst_off / sizeof(T) + it * P::RS * L::STRIDE) =
                *reinterpret_cast<const uint4*>(s);
        }
    }
}

// ---- matrix units: ldmatrix + mma.sync m16n8k16 ------------------------------------------------
TILEC_DEV void ldmatrix_x4(uint32_t (&r)[4], uint32_t a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
TILEC_DEV void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
TILEC_DEV void ldmatrix_x2(uint32_t (&r)[2], uint32_t a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
TILEC_DEV void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

// D = A * B + D for one 16x8x16 tile; A: 4 registers of 2 x 16-bit, B: 2, D: 4 floats.
template <class K> struct Mma;
template <> struct Mma<F16> {
    static TILEC_DEV void run(float* d, const uint32_t (&a)[4], const uint32_t* b) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
template <> struct Mma<BF16> {
    static TILEC_DEV void run(float* d, const uint32_t (&a)[4], const uint32_t* b) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

// The accumulator layout shared by every tile GEMM (see MmaLayout in tilec/ir/layout.py): warps
// form a WARPS_M x WARPS_N grid; warp (wm, wn) owns rows wm*WM.., columns wn*WN.. of the tile, as
// MI x NI tiles of 16 x 8; in tile (mi, ni) lane l holds rows l/4 and l/4 + 8, columns
// 2 (l % 4) + {0, 1}, in acc[(mi * NI + ni) * 4 + {0, 1, 2, 3}].
template <int BM, int BN, int WARPS_M, int WARPS_N> struct Warps {
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N, MI = WM / 16, NI = WN / 8;
    static_assert(WM % 16 == 0 && WN % 8 == 0, "warp tiles are multiples of 16 x 8");
    static TILEC_DEV int m0() { return (int)(threadIdx.x / 32) / WARPS_N * WM; }
    static TILEC_DEV int n0() { return (int)(threadIdx.x / 32) % WARPS_N * WN; }
};

TILEC_HD constexpr bool pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

// The A and B fragments a warp reads from shared tiles for its mma tiles (MI x NI of 16 x 8).
// The lane's address of its first fragment is computed once (the layout's swizzle of the
// lane's row and column, invariant across a K loop); each other fragment's is L::advance of
// it by constants: one XOR and an immediate offset per ldmatrix. That holds where the steps
// along a tile's columns keep apart from the lane's own column the chunk bits the XOR touches:
// always for steps of 16 along k, for steps along m or n when the warp's fragment count is a
// power of two (FAST); otherwise each fragment takes L::offset.
//   A: a [BM][BK] tile (TA false) or a [BK][BM] tile (TA true, read transposed).
template <int MI, bool TA, class LA> struct AFrags {
    static constexpr bool FAST = !TA || pow2(MI);
    uint32_t base;
    int off, m0, lane;
    TILEC_DEV AFrags(const void* As, int m0_) : base(smem_addr(As)), m0(m0_), lane(threadIdx.x % 32) {
        const int q = lane / 8;
        off = TA ? LA::offset((q / 2) * 8 + lane % 8, m0 + (q % 2) * 8)
                 : LA::offset(m0 + lane % 16, (lane / 16) * 8);
    }
    TILEC_DEV void load(uint32_t (&a)[MI][4], int kk) const {
        const int q = lane / 8;
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
            if (!TA) {
                const int o = FAST ? LA::advance(off, mi * 16, kk)
                                   : LA::offset(m0 + mi * 16 + lane % 16, kk + (lane / 16) * 8);
                ldmatrix_x4(a[mi], base + 2u * (uint32_t)o);
            } else {
                const int o = FAST ? LA::advance(off, kk, mi * 16)
                                   : LA::offset(kk + (q / 2) * 8 + lane % 8, m0 + mi * 16 + (q % 2) * 8);
                ldmatrix_x4_trans(a[mi], base + 2u * (uint32_t)o);
            }
        }
    }
};
//   B: a [BK][BN] tile (TB false: rows are k, read transposed) or a [BN][BK] tile (TB true).
//   n-tiles go in pairs (x4 loads); an odd count's last one alone (x2).
template <int NI, bool TB, class LB> struct BFrags {
    static constexpr bool FAST = TB || pow2(NI);
    uint32_t base;
    int off, n0, lane;
    TILEC_DEV BFrags(const void* Bs, int n0_) : base(smem_addr(Bs)), n0(n0_), lane(threadIdx.x % 32) {
        const int q = lane / 8;
        off = TB ? LB::offset(n0 + (q / 2) * 8 + lane % 8, (q % 2) * 8)
                 : LB::offset((q % 2) * 8 + lane % 8, n0 + (q / 2) * 8);
    }
    TILEC_DEV void load(uint32_t (&b)[NI][2], int kk) const {
        const int q = lane / 8;
#pragma unroll
        for (int ni = 0; ni + 1 < NI; ni += 2) {
            uint32_t r[4];
            if (!TB) {
                const int o = FAST ? LB::advance(off, kk, ni * 8)
                                   : LB::offset(kk + (q % 2) * 8 + lane % 8, n0 + ni * 8 + (q / 2) * 8);
                ldmatrix_x4_trans(r, base + 2u * (uint32_t)o);
            } else {
                const int o = FAST ? LB::advance(off, ni * 8, kk)
                                   : LB::offset(n0 + ni * 8 + (q / 2) * 8 + lane % 8, kk + (q % 2) * 8);
                ldmatrix_x4(r, base + 2u * (uint32_t)o);
            }
            b[ni][0] = r[0]; b[ni][1] = r[1]; b[ni + 1][0] = r[2]; b[ni + 1][1] = r[3];
        }
        if (NI % 2) {
            constexpr int ni = NI - 1;
            uint32_t r[2];
            const int l = lane % 16;  // lanes 16..31 supply ignored (but valid) addresses
            if (!TB) {
                ldmatrix_x2_trans(r, base + 2u * (uint32_t)LB::offset(kk + (l / 8) * 8 + l % 8, n0 + ni * 8));
            } else {
                ldmatrix_x2(r, base + 2u * (uint32_t)LB::offset(n0 + ni * 8 + l % 8, kk + (l / 8) * 8));
            }
            b[ni][0] = r[0]; b[ni][1] = r[1];
        }
    }
};

// One k-step of a warp's mma tiles: acc += a * b for its MI x NI tiles of 16 x 8. With
// TILEC_MMA_SERPENTINE the odd rows of tiles run their columns backwards, so the B fragment of
// a row's last mma is the next row's first (operand reuse at the turn: 124 of 128 HMMA of the
// 128x128x64 K loop reuse an operand register, against 112; the same sums in the same order
// per accumulator). A benchmark knob, off until measured on a device.
#ifndef TILEC_MMA_SERPENTINE
#define TILEC_MMA_SERPENTINE 0
#endif
template <int MI, int NI, class K>
TILEC_DEV void mma_step(float* acc, const uint32_t (&a)[MI][4], const uint32_t (&b)[NI][2]) {
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int n = 0; n < NI; ++n) {
            const int ni = TILEC_MMA_SERPENTINE && (mi & 1) ? NI - 1 - n : n;
            Mma<K>::run(acc + (mi * NI + ni) * 4, a[mi], b[ni]);
        }
}

// acc += A(BM x BK) * B(BK x BN) from shared tiles (A [BM][BK] or, TA, [BK][BM]; B [BK][BN] or,
// TB, [BN][BK]) on the matrix units; all BM*BN/.. threads of the warp grid call it together.
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, bool TA, bool TB, class LA, class LB,
          class K>
TILEC_DEV void gemm_ss(const typename K::storage* As, const typename K::storage* Bs, float* acc) {
    typedef Warps<BM, BN, WARPS_M, WARPS_N> W;
    static_assert(BK % 16 == 0, "the K tile is a multiple of 16");
    static_assert(sizeof(typename K::storage) == 2, "16-bit operands: 8 per 16-byte chunk");
    const AFrags<W::MI, TA, LA> fa(As, W::m0());
    const BFrags<W::NI, TB, LB> fb(Bs, W::n0());
    // fragments of two k-steps in flight: the loads of step s + 1 are issued before the mma of s
    uint32_t a[2][W::MI][4], b[2][W::NI][2];
#ifndef TILEC_FRAGMENT_DOUBLE_BUFFER
#define TILEC_FRAGMENT_DOUBLE_BUFFER 1
#endif
    constexpr bool DB = TILEC_FRAGMENT_DOUBLE_BUFFER != 0;
    if (DB) { fa.load(a[0], 0); fb.load(b[0], 0); }
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
        const int cur = DB ? (kk / 16) % 2 : 0;
        if (!DB) { fa.load(a[0], kk); fb.load(b[0], kk); }
        else if (kk + 16 < BK) { fa.load(a[cur ^ 1], kk + 16); fb.load(b[cur ^ 1], kk + 16); }
        mma_step<W::MI, W::NI, K>(acc, a[cur], b[cur]);
    }
}

// The fragments of gemm_ss_overlapped's k-steps, kept across the iterations of a pipelined K loop:
// [0] holds the first k-step's when a call starts (load() before the loop, the previous call
// after it).
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, bool TA, bool TB, class LA, class LB,
          class K>
struct SsFragments {
    typedef Warps<BM, BN, WARPS_M, WARPS_N> W;
    uint32_t a[2][W::MI][4], b[2][W::NI][2];
    // the first k-step's fragments of the tiles As, Bs into [slot]
    TILEC_DEV void load(const typename K::storage* As, const typename K::storage* Bs, int slot = 0) {
        AFrags<W::MI, TA, LA>(As, W::m0()).load(a[slot], 0);
        BFrags<W::NI, TB, LB>(Bs, W::n0()).load(b[slot], 0);
    }
};

// gemm_ss for the last statement of a pipelined K loop, overlapped with the loop's end: the
// k-steps compute from fragments loaded one step ahead (the first by the previous call); before
// the last k-step, `sync()` (the loop's wait for its next tiles and barrier) runs, the first
// fragments of the next tiles (An, Bn) load and `refill()` (the copies of a later tile into the
// stage this call read, free after the barrier) is issued, while the last k-step's mma run.
// Without it the matrix units idle at every K tile while the warp waits at the barrier and for
// its first loads.
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, bool TA, bool TB, class LA, class LB,
          class K, class Sync, class Refill>
TILEC_DEV void gemm_ss_overlapped(SsFragments<BM, BN, BK, WARPS_M, WARPS_N, TA, TB, LA, LB, K>& f,
                                  const typename K::storage* As, const typename K::storage* Bs,
                                  const typename K::storage* An, const typename K::storage* Bn,
                                  float* acc, Sync sync, Refill refill) {
    typedef Warps<BM, BN, WARPS_M, WARPS_N> W;
    static_assert(BK % 16 == 0, "the K tile is a multiple of 16");
    constexpr int KS = BK / 16;
    const AFrags<W::MI, TA, LA> fa(As, W::m0());
    const BFrags<W::NI, TB, LB> fb(Bs, W::n0());
#pragma unroll
    for (int s = 0; s < KS; ++s) {
        const int cur = s % 2;
        if (s + 1 < KS) {
            fa.load(f.a[cur ^ 1], (s + 1) * 16);
            fb.load(f.b[cur ^ 1], (s + 1) * 16);
        } else {
            sync();
            f.load(An, Bn, cur ^ 1);
            refill();
        }
        mma_step<W::MI, W::NI, K>(acc, f.a[cur], f.b[cur]);
    }
    if (KS % 2) {  // the next tiles' first fragments went to [1]: to [0] (register moves)
#pragma unroll
        for (int mi = 0; mi < W::MI; ++mi)
#pragma unroll
            for (int r = 0; r < 4; ++r) f.a[0][mi][r] = f.a[1][mi][r];
#pragma unroll
        for (int ni = 0; ni < W::NI; ++ni) { f.b[0][ni][0] = f.b[1][ni][0]; f.b[0][ni][1] = f.b[1][ni][1]; }
    }
}

// acc += A * B(BK x BN) with A in registers: a 16-bit fragment laid out like an accumulator of
// BM x BK on WARPS_M x 1 warps (attention's P). Columns 16s..16s+15 of A form the A operand of
// k-step s: the accumulator layout of two 16x8 tiles is the A layout of one 16x16.
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, bool TB, class LB, class K>
TILEC_DEV void gemm_rs(const uint32_t* a_frag, const typename K::storage* Bs, float* acc) {
    typedef Warps<BM, BN, WARPS_M, WARPS_N> W;
    static_assert(WARPS_N == 1, "A in registers needs whole rows in each warp");
    constexpr int NIA = BK / 8;  // n-tiles of the A fragment
    const BFrags<W::NI, TB, LB> fb(Bs, W::n0());
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
        uint32_t b[W::NI][2];
        fb.load(b, kk);
#pragma unroll
        for (int mi = 0; mi < W::MI; ++mi) {
            // tiles (mi, kk/8) and (mi, kk/8 + 1) of the fragment: 2 registers each (rows g, g+8)
            const uint32_t* t = a_frag + (mi * NIA + kk / 8) * 2;
            const uint32_t a[4] = {t[0], t[1], t[2], t[3]};
#pragma unroll
            for (int ni = 0; ni < W::NI; ++ni) Mma<K>::run(acc + (mi * W::NI + ni) * 4, a, b[ni]);
        }
    }
}

// ---- tf32 (`precision tf32`): f32 products on the matrix units -------------------------------
// An f32 rounded to tf32 (10 mantissa bits, to nearest, ties away from zero), in a 32-bit register.
TILEC_DEV uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

// D = A * B + D for one 16x8x8 tile of tf32 operands; A: 4 registers, B: 2, D: 4 floats (the
// accumulator layout of the 16-bit mma: lane l holds rows l/4, l/4 + 8, columns 2 (l % 4) + {0, 1}).
TILEC_DEV void mma_tf32(float* d, const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// acc += A(BM x BK) * B(BK x BN) from shared f32 tiles (A [BM][BK] or, TA, [BK][BM]; B [BK][BN]
// or, TB, [BN][BK]) on the matrix units in tf32, k-steps of 8, into the accumulator layout of
// gemm_ss. Lane (g, c) = (l / 4, l % 4) of the m16n8k8 fragments holds A rows g, g + 8 at k = c,
// c + 4 and B column g at k = c, c + 4: 32-bit shared loads at the layout's offsets (the layout
// pass pads the rows so that each load's 32 lanes hit 32 banks), each rounded by to_tf32.
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, bool TA, bool TB, class LA, class LB>
TILEC_DEV void gemm_ss_tf32(const float* As, const float* Bs, float* acc) {
    typedef Warps<BM, BN, WARPS_M, WARPS_N> W;
    static_assert(BK % 8 == 0, "the K tile is a multiple of 8");
    const int lane = (int)threadIdx.x % 32, g = lane >> 2, c = lane & 3;
    const int m0 = W::m0() + g, n0 = W::n0() + g;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 8) {
        uint32_t a[W::MI][4], b[W::NI][2];
#pragma unroll
        for (int mi = 0; mi < W::MI; ++mi)
#pragma unroll
            for (int e = 0; e < 4; ++e) {  // (row g, k c), (g + 8, c), (g, c + 4), (g + 8, c + 4)
                const int r = m0 + mi * 16 + (e & 1) * 8, k = kk + c + (e >> 1) * 4;
                a[mi][e] = to_tf32(As[TA ? LA::offset(k, r) : LA::offset(r, k)]);
            }
#pragma unroll
        for (int ni = 0; ni < W::NI; ++ni)
#pragma unroll
            for (int e = 0; e < 2; ++e) {  // (k c, column g), (c + 4, g)
                const int n = n0 + ni * 8, k = kk + c + e * 4;
                b[ni][e] = to_tf32(Bs[TB ? LB::offset(n, k) : LB::offset(k, n)]);
            }
#pragma unroll
        for (int mi = 0; mi < W::MI; ++mi)
#pragma unroll
            for (int ni = 0; ni < W::NI; ++ni) mma_tf32(acc + (mi * W::NI + ni) * 4, a[mi], b[ni]);
    }
}

// The same product on the scalar units, for dtypes the matrix units do not take (f32 under
// `precision ieee`, f64, integers) and tiles they cannot split: each thread computes its own
// accumulator elements, in the same layout (rows m0 + 16 mi + 8 h, columns n0 + 8 ni + v).
// An operand whose tile rows are M or N and whose values are 4 or 8 bytes (A, B transposed) is
// read 16 bytes at a time along k where its layout keeps those bytes together (the rows a whole
// number of chunks): a k-step of VK values takes one ld.shared.v4 (v2 for 8 bytes) per row of
// the lane instead of VK scalar loads, the loads that bounded this loop (each feeds only
// 2 x NI or 2 x MI FMAs). Each accumulator still sums its products in k order, as before.
template <int V, class K, class L, bool ALONG_K, typename Acc>
TILEC_DEV void simt_operand(Acc* out, const typename K::storage* s, int row, int k) {
    static_assert(V == 1 || ALONG_K, "vector loads run along a row of k");
    if constexpr (V > 1) {
        typename K::reg r[V];
        load_vec_whole<V, K, LOAD_ANY>(r, s + L::offset(row, k));
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] = (Acc)r[v];
    } else {
        out[0] = (Acc)K::load(s[ALONG_K ? L::offset(row, k) : L::offset(k, row)]);
    }
}
// k values of an operand one vector load reads (1: scalar loads): rows of M or N (ALONG_K) of
// 4- or 8-byte values in a layout of whole 16-byte chunks per row (`make
// NVCCFLAGS="-O3 -DTILEC_SIMT_VECTOR=0"`: scalar loads throughout, for measuring)
#ifndef TILEC_SIMT_VECTOR
#define TILEC_SIMT_VECTOR 1
#endif
template <class K, class L, bool ALONG_K, int BK> TILEC_HD constexpr int simt_vec() {
    constexpr int size = (int)sizeof(typename K::storage), v = 16 / size;
    return TILEC_SIMT_VECTOR && ALONG_K && L::ROW_CHUNKS && (size == 4 || size == 8) &&
           BK % v == 0 ? v : 1;
}
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, bool TA, bool TB, class LA, class LB,
          class KA, class KB, typename Acc>
TILEC_DEV void gemm_simt(const typename KA::storage* As, const typename KB::storage* Bs, Acc* acc) {
    typedef Warps<BM, BN, WARPS_M, WARPS_N> W;
    constexpr int VA = simt_vec<KA, LA, !TA, BK>(), VB = simt_vec<KB, LB, TB, BK>();
    constexpr int VK = VA > VB ? VA : VB;  // (1, 2 or 4: each divides VK)
    const int lane = threadIdx.x % 32, m0 = W::m0() + lane / 4, n0 = W::n0() + (lane % 4) * 2;
#pragma unroll 2
    for (int k = 0; k < BK; k += VK) {
        Acc a[W::MI][2][VK];
#pragma unroll
        for (int mi = 0; mi < W::MI; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int kk = 0; kk < VK; kk += VA)
                    simt_operand<VA, KA, LA, !TA>(&a[mi][h][kk], As, m0 + mi * 16 + h * 8, k + kk);
        // (B a column block at a time: its values live across the MI x 2 rows' FMAs only)
#pragma unroll
        for (int ni = 0; ni < W::NI; ++ni) {
            Acc b[2][VK];
#pragma unroll
            for (int v = 0; v < 2; ++v)
#pragma unroll
                for (int kk = 0; kk < VK; kk += VB)
                    simt_operand<VB, KB, LB, TB>(&b[v][kk], Bs, n0 + ni * 8 + v, k + kk);
#pragma unroll
            for (int mi = 0; mi < W::MI; ++mi)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    Acc& d = acc[(mi * W::NI + ni) * 4 + e];
#pragma unroll
                    for (int kk = 0; kk < VK; ++kk) d = fma_acc(a[mi][e / 2][kk], b[e % 2][kk], d);
                }
        }
    }
}

// acc += A * B on the scalar units with A in registers (an f32/f64 fragment laid out like an
// accumulator of BM x BK on WARPS_M x 1 warps, e.g. attention's probabilities when the program
// keeps them in f32): the four lanes of a quad hold a row's columns between them, so each A value
// comes from its owner by a shuffle.
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, bool TB, class LB, class KB, typename A,
          typename Acc>
TILEC_DEV void gemm_simt_rs(const A* a_frag, const typename KB::storage* Bs, Acc* acc) {
    typedef Warps<BM, BN, WARPS_M, WARPS_N> W;
    static_assert(WARPS_N == 1, "A in registers needs whole rows in each warp");
    constexpr int NIA = BK / 8;  // 8-column tiles of the A fragment
    const int lane = threadIdx.x % 32, quad = lane & ~3, n0 = W::n0() + (lane % 4) * 2;
#pragma unroll  // register indices must be constants
    for (int k = 0; k < BK; ++k) {
        Acc b[W::NI][2];
#pragma unroll
        for (int ni = 0; ni < W::NI; ++ni)
#pragma unroll
            for (int v = 0; v < 2; ++v) {
                const int c = n0 + ni * 8 + v;
                b[ni][v] = (Acc)KB::load(Bs[TB ? LB::offset(c, k) : LB::offset(k, c)]);
            }
#pragma unroll
        for (int mi = 0; mi < W::MI; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                // column k of row (mi, h) sits in lane quad + (k % 8) / 2, register below
                const A mine = a_frag[((mi * NIA + k / 8) * 2 + h) * 2 + (k % 2)];
                const Acc a = (Acc)__shfl_sync(0xffffffffu, mine, quad + (k % 8) / 2);
#pragma unroll
                for (int ni = 0; ni < W::NI; ++ni)
#pragma unroll
                    for (int v = 0; v < 2; ++v) {
                        Acc& d = acc[(mi * W::NI + ni) * 4 + h * 2 + v];
                        d = fma_acc(a, b[ni][v], d);
                    }
            }
    }
}

// ---- GEMV of 4-bit weights on the matrix units (M <= 16, decode) --------------------------------
// dst[(w * MR + i) * LD + j] (w = the calling warp, i < MR, j < BN) = sum over warp w's rows r of
// a[i * lda + r] * H((q[r, col0 + j] - zero) * s[r / group, col0 + j]) for the m rows of A
// given (i < m <= MR; rows i >= m come out 0), each weight rounded to H as dequant4x8 rounds it.
// The 16-row chunks (rows 16c .. 16c + 15) that hold rows first .. first + rows - 1 go to the
// SLICES warps in contiguous runs of cdiv(chunks, SLICES), rows outside that range masked (group
// is a multiple of 16, so a chunk lies in one group and a warp loads each group's scales once).
// The product runs transposed, C^T = W^T A^T, as m16n8k16 mma: A = 16 columns x 16 rows of
// dequantized weights, straight from the loaded words into registers (no shared memory), B = the
// 16 activations of up to 8 rows of A (row n of A in column n: lanes g = n; columns of absent
// rows zero), C = 16 columns x 8 rows of A; MR = 16 takes a second mma on the same weights for
// rows 8..15. So a decode batch of up to 8 rows costs what one row does: the weights are read
// and dequantized once. Lane (g, c) loads the words of rows 2c, 2c + 1, 2c + 8, 2c + 9 of the
// chunk for columns 8g .. 8g + 7 of each 64-column group; tile t of a group is columns 8g + 2t
// (mma row g) and 8g + 2t + 1 (row g + 8): a byte permute pairs byte t of two rows' words, and
// one LOP3 each puts the low and the high nibble of both rows into an mma register (the pair of
// rows along k that the A layout wants). About 3 instructions per weight against 5 for the
// scalar GEMV. With N % 8 != 0 (words would straddle rows) the sums are computed value by value;
// `a`, `q` and `s` may have any alignment (unaligned ones load element by element). Columns past
// N read no memory and come out 0.
// One 16-row chunk of the GEMV as a lane holds it: its weight words (rows 2c, 2c + 1, 2c + 8,
// 2c + 9 of columns 8g .. 8g + 7 of each 64-column group), its activations (B: rows g and, for
// NT = 2, g + 8 of A) and the scales of its quantization group (columns 8g .. 8g + 7, 16 bits
// each).
template <int NG, int NT> struct Gemv4Chunk {
    uint32_t w[NG][4], b[NT][2], s[NG][4];
};

// The n8 tiles of A's rows a GEMV of MR rows takes (1 for MR <= 8, 2 for MR <= 16)
template <int MR> struct GemvRows {
    static_assert(MR >= 1 && MR <= 16, "a matrix-unit GEMV takes at most 16 rows of A");
    static constexpr int NT = (MR + 7) / 8;
};

// Store a warp's sums: lane (g, c) holds, in acc[..][nt][e] of mma tile t of 64-column group gg,
// A row 8 nt + 2c + (e & 1) at column 8g + 2t + (e >> 1) of the group.
template <int MR, int NT, int NG, int LD>
TILEC_DEV void gemv4_mma_store(float* dst, const float (&acc)[NG][4][NT][4], int p) {
    const int lane = (int)threadIdx.x % 32, warp = (int)threadIdx.x / 32, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int i = nt * 8 + 2 * c + e;
            if (i >= MR) continue;
#pragma unroll
            for (int gg = 0; gg < NG; ++gg)
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    float* d = dst + (warp * MR + i) * LD + p + gg * 64 + 8 * g + 2 * t;
                    d[0] = acc[gg][t][nt][e];
                    d[1] = acc[gg][t][nt][e + 2];
                }
        }
}

// Load the chunk at row r0: rows outside beg .. end - 1 and columns past N are zeros, read from
// nowhere; any alignment (element by element).
// `ar` is the lane's row g of A (row g + 8 is ld8 further), given[nt] whether row g + 8 nt is
// one of the rows the GEMV takes (else its activations are zeros).
template <class H, bool SIGNED, int NG, int NT>
TILEC_DEV void gemv4_mma_load_guarded(Gemv4Chunk<NG, NT>& ch, const typename H::storage* ar,
                                      int64_t ld8, const bool (&given)[NT], const uint8_t* q,
                                      const typename H::storage* s, int64_t N, int64_t group,
                                      int64_t r0, int64_t beg, int64_t end, int64_t col0) {
    const int lane = (int)threadIdx.x % 32, g = lane >> 2, c = lane & 3;
    // B: activations r0 + 2c + {0, 1} and r0 + 2c + 8 + {0, 1} of A's rows g (+ 8 nt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const typename H::storage* ai = ar + nt * ld8;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t r = r0 + 2 * c + 8 * h;
            const uint32_t lo = given[nt] && r >= beg && r < end ? (uint32_t)ai[r] : 0u;
            const uint32_t hi = given[nt] && r + 1 >= beg && r + 1 < end ? (uint32_t)ai[r + 1] : 0u;
            ch.b[nt][h] = lo | (hi << 16);
        }
    }
    const int64_t half = N >> 1;
    const uint8_t* qrow = q + (r0 + 2 * c) * half + ((col0 + 8 * g) >> 1);
    const typename H::storage* srow = s + (r0 / group) * N + col0 + 8 * g;
#pragma unroll
    for (int gg = 0; gg < NG; ++gg) {
        const bool cols = col0 + gg * 64 + 8 * g < N;  // the lane's 8 columns: all or none
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // rows r0 + 2c, + 1, + 8, + 9
            const int dr = (e & 1) + (e >> 1) * 8;
            const uint8_t* p = qrow + dr * half + gg * 32;
            ch.w[gg][e] = 0u;
            if (cols && r0 + 2 * c + dr >= beg && r0 + 2 * c + dr < end) {
                ch.w[gg][e] = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
                              ((uint32_t)p[3] << 24);
            }
            if (SIGNED) ch.w[gg][e] ^= 0x88888888u;  // q + 8 for two's complement nibbles
        }
        const typename H::storage* sp = srow + gg * 64;
#pragma unroll
        for (int t = 0; t < 4; ++t)
            ch.s[gg][t] = cols ? (uint32_t)sp[2 * t] | ((uint32_t)sp[2 * t + 1] << 16) : 0u;
    }
}

// The GEMV's weight words, read once (non-coherent path) with an L2 prefetch size hint: each warp
// reads 32 bytes of a row and the blocks of the neighbouring columns read the rest of the row at
// about the same time, so asking DRAM for TILEC_GEMV_PREFETCH bytes (64, 128 or 256; 0: no hint)
// at the first touch turns many short reads into fewer long ones. Measured on the H200 (the
// weights of N = K = 8192 alone, read in this pattern): 14.4 us without a hint, 13.9 with 64
// bytes, 12.7 with 128, 13.6 with 256; the GEMV 0.019 -> 0.0185 ms (docs/PERFORMANCE.md).
#ifndef TILEC_GEMV_PREFETCH
#define TILEC_GEMV_PREFETCH 128
#endif
TILEC_DEV uint32_t ld_weight_word(const uint8_t* p) {
#if TILEC_GEMV_PREFETCH
    uint32_t v;
    asm("ld.global.nc.L2::" TILEC_STR(TILEC_GEMV_PREFETCH) "B.b32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
#else
    return *reinterpret_cast<const uint32_t*>(p);
#endif
}

// A warp's whole chunks of whole, aligned columns, loaded in order: the lane's addresses of the
// next chunk, advanced by one chunk at each load (no multiplications in the loop).
template <class H, bool SIGNED, int NG, int NT> struct Gemv4Stream {
    const uint8_t* q;               // the lane's word of row r + 2c
    const typename H::storage* a;   // activation r + 2c of A's row g
    const typename H::storage* s;   // the lane's scales of row r's quantization group
    int64_t half, N, ld8;           // bytes per row of words; scales per row; 8 rows of A
    int left, per_group;            // chunks left in the group, and in a group
    bool given[NT];                 // the lane's rows g + 8 nt of A are given (else B is 0)
    TILEC_DEV Gemv4Stream(const typename H::storage* ar, int64_t ld8_, const bool (&given_)[NT],
                          const uint8_t* q_, const typename H::storage* s_, int64_t N_, int64_t r0,
                          int64_t col0, int64_t group)
        : half(N_ >> 1), N(N_), ld8(ld8_), left((int)((group - r0 % group) >> 4)),
          per_group((int)(group >> 4)) {
        const int lane = (int)threadIdx.x % 32, g = lane >> 2, c = lane & 3;
        q = q_ + (r0 + 2 * c) * half + ((col0 + 8 * g) >> 1);
        a = ar + r0 + 2 * c;
        s = s_ + (r0 / group) * N + col0 + 8 * g;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) given[nt] = given_[nt];
    }
    TILEC_DEV void load(Gemv4Chunk<NG, NT>& ch) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {  // B: activations r + 2c + {0, 1}, r + 2c + 8 + {0, 1}
            ch.b[nt][0] = ch.b[nt][1] = 0u;
            if (given[nt]) {
                const typename H::storage* an = a + nt * ld8;
                ch.b[nt][0] = *reinterpret_cast<const uint32_t*>(an);
                ch.b[nt][1] = *reinterpret_cast<const uint32_t*>(an + 8);
            }
        }
        if (left == 0) {  // the next quantization group (group is a multiple of 16 rows)
            s += N;
            left = per_group;
        }
        --left;
        const typename H::storage* sp = s;
#pragma unroll
        for (int gg = 0; gg < NG; ++gg) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {  // rows r + 2c, + 1, + 8, + 9
                const int dr = (e & 1) + (e >> 1) * 8;
                ch.w[gg][e] = ld_weight_word(q + dr * half + gg * 32);
                if (SIGNED) ch.w[gg][e] ^= 0x88888888u;  // q + 8 for two's complement nibbles
            }
            const uint4 v = *reinterpret_cast<const uint4*>(sp + gg * 64);
            ch.s[gg][0] = v.x; ch.s[gg][1] = v.y; ch.s[gg][2] = v.z; ch.s[gg][3] = v.w;
        }
        q += 16 * half;
        a += 16;
    }
};

// acc += the chunk's weights (dequantized with its scales) times its activations: C column n of
// n8 tile nt is A's row 8 nt + n (columns of absent rows: B is zero there, their sums unused).
template <class H, int NG, int NT>
TILEC_DEV void gemv4_mma_math(float (&acc)[NG][4][NT][4], const Gemv4Chunk<NG, NT>& ch,
                              uint32_t bias) {
#pragma unroll
    for (int gg = 0; gg < NG; ++gg)
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const int sel = t | (t << 4) | ((t + 4) << 8) | ((t + 4) << 12);
            const uint32_t u[2] = {__byte_perm(ch.w[gg][0], ch.w[gg][1], sel),
                                   __byte_perm(ch.w[gg][2], ch.w[gg][3], sel)};
            // (s, s) of columns 8g + 2t and 8g + 2t + 1
            const uint32_t sc[2] = {Pair16<H>::lows(ch.s[gg][t]), Pair16<H>::highs(ch.s[gg][t])};
            uint32_t A[4];  // rows g (column 8g + 2t) and g + 8 (8g + 2t + 1); k 2c.. and 2c + 8..
#pragma unroll
            for (int e = 0; e < 4; ++e)
                A[e] = dequant_pair<H>(e & 1 ? u[e >> 1] >> 4 : u[e >> 1], bias, sc[e & 1]);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) Mma<H>::run(acc[gg][t][nt], A, ch.b[nt]);
        }
}

// Chunks in flight per warp in the GEMV's loop over whole chunks (a tuning knob: 2 with 32 warps
// per SM measured faster than 4-8 with 16, docs/PERFORMANCE.md)
#ifndef TILEC_GEMV_DEPTH
#define TILEC_GEMV_DEPTH 2
#endif

template <class H, bool SIGNED, int BN, int SLICES, int LD, int MR = 1>
TILEC_DEV void gemv_dequant4_mma(const typename H::storage* a, int64_t lda, int64_t m,
                                 const uint8_t* q, const typename H::storage* s, int64_t N,
                                 int64_t first, int64_t rows, int64_t col0, int64_t group,
                                 uint32_t bias, float* dst) {
    // passes of up to 128 columns (32 accumulator registers per lane and n8 tile; 64 columns
    // where two n8 tiles take A's 16 rows)
    constexpr int NT = GemvRows<MR>::NT;
    constexpr int PASS = BN % 128 == 0 && NT == 1 ? 128 : 64, NG = PASS / 64, D = TILEC_GEMV_DEPTH;
    static_assert(BN % PASS == 0, "64-column groups");
    const int lane = (int)threadIdx.x % 32, warp = (int)threadIdx.x / 32, g = lane >> 2;
    // A's rows given (the rest come out 0); one row: m is 1 (a lane's B: row g of A, given for
    // g = 0 alone, and no row stride: the registers of the one-row GEMV)
    const int mr = MR == 1 ? 1 : m < MR ? (int)m : MR;
    const typename H::storage* ar = a + (MR == 1 ? 0 : g * lda);
    const int64_t ld8 = NT == 2 ? 8 * lda : 0;
    bool given[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) given[nt] = g + 8 * nt < mr;
    const int64_t end = first + rows, c0 = first >> 4, chunks = rows > 0 ? ((end + 15) >> 4) - c0 : 0;
    const int64_t per = (chunks + SLICES - 1) / SLICES * 16;  // rows per warp, whole chunks
    const int64_t wb = c0 * 16 + warp * per, we = wb + per < end ? wb + per : end;
    if (N % 8 != 0) {
        // words would straddle rows: the same sums value by value (a hand-written gemv_mma; the
        // tile pass only emits it under `if N % 8 == 0`)
        const float base = H::load((uint16_t)(Pair16<H>::magic & 0xffffu)) + (SIGNED ? 8.0f : 0.0f);
        const float z = H::load((uint16_t)bias) - base;  // bias = MAGIC + zero (+ 8 if signed)
        // (a row of A at a time: each weight is dequantized again for each row)
        for (int i = 0; i < MR; ++i)
            for (int j = lane; j < BN; j += 32) {
                const int64_t n = col0 + j;
                float sum = 0.0f;
                if (n < N && i < mr) {
                    for (int64_t r = wb > first ? wb : first; r < we; ++r) {
                        const int32_t v = SIGNED ? load_i4(q, r, n, N) : load_u4(q, r, n, N);
                        const float w = H::load(H::store(((float)v - z) * H::load(s[(r / group) * N + n])));
                        sum = fma_acc(H::load(a[i * lda + r]), w, sum);
                    }
                }
                dst[(warp * MR + i) * LD + j] = sum;
            }
        return;
    }
    const bool aligned = (reinterpret_cast<uintptr_t>(a) & 3) == 0 && (mr == 1 || (lda & 1) == 0) &&
                         (reinterpret_cast<uintptr_t>(q) & 3) == 0 &&
                         (reinterpret_cast<uintptr_t>(s) & 15) == 0;
    for (int p = 0; p < BN; p += PASS) {
        float acc[NG][4][NT][4];
#pragma unroll
        for (int gg = 0; gg < NG; ++gg)
#pragma unroll
            for (int t = 0; t < 4; ++t)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[gg][t][nt][e] = 0.0f;
        // the warp's chunks wb, wb + 16, .. (the first may be cut by `first`, the last by `end`);
        // whole ones of whole, aligned columns take the loop without tests (a uniform test)
        const bool fast = aligned && col0 + p + PASS <= N;
        const int64_t fb = fast ? (wb < first ? wb + 16 : wb) : we, fe = fast ? we & ~int64_t(15) : we;
        for (int64_t r0 = wb; r0 < we; r0 += 16) {
            if (r0 == fb && fe > fb) {  // the whole chunks: below
                r0 = fe - 16;
                continue;
            }
            // chunks cut by first or end, columns cut by N, unaligned: one at a time, guarded
            Gemv4Chunk<NG, NT> ch;
            gemv4_mma_load_guarded<H, SIGNED, NG, NT>(ch, ar, ld8, given, q, s, N, group, r0,
                                                      first, end, col0 + p);
            gemv4_mma_math<H, NG, NT>(acc, ch, bias);
        }
        if (fe > fb) {
            // whole chunks: a ring of D chunks in flight, each loaded D chunks before its math
            const int n = (int)((fe - fb) >> 4);
            Gemv4Stream<H, SIGNED, NG, NT> stream(ar, ld8, given, q, s, N, fb, col0 + p, group);
            Gemv4Chunk<NG, NT> ring[D];
#pragma unroll
            for (int j = 0; j < D; ++j)
                if (j < n) stream.load(ring[j]);
            for (int i = 0; i < n; i += D) {
#pragma unroll
                for (int j = 0; j < D; ++j) {
                    if (i + j < n) {
                        gemv4_mma_math<H, NG, NT>(acc, ring[j], bias);
                        if (i + j + D < n) stream.load(ring[j]);
                    }
                }
            }
        }
        gemv4_mma_store<MR, NT, NG, LD>(dst, acc, p);
    }
}

// ---- GEMV of 4-bit weights packed along K, on the matrix units (M <= 16, decode) ------------
// The layout GPTQ-style checkpoints store: q is [N, K] (each column's K weights contiguous, two
// per byte, low nibble first) and s is [N, SK] (s[n, r / group]); the program reads them as
// `dequant(q.T, s.T, ...)`. dst[(w * MR + i) * LD + j] (w = the calling warp, i < MR, j < BN) =
// the sum over warp w's rows r of a[i * lda + r] * H((q[col0 + j, r] - zero) * s[col0 + j,
// r / group]) for the m rows of A given (i < m <= MR; rows i >= m come out 0), each weight
// rounded to H. The 128-row chunks (rows 128c .. 128c + 127) that hold rows first .. first + rows - 1 go to
// the SLICES warps in contiguous runs of cdiv(chunks, SLICES), rows outside that range masked.
// Every load is 16 bytes of one column: lane (g, c) reads rows 32c .. 32c + 31 of a chunk for
// columns g and g + 8 of each 16-column group, so the 4 lanes of a quad read 64 contiguous bytes
// of a column and a warp's consecutive chunks continue them (no 32-byte pieces of far-apart rows,
// which the row-major layout's GEMV is held by). The product runs transposed, C^T = W^T A^T, as
// m16n8k16 mma: A = 16 columns x 16 rows; a weight word holds 8 consecutive rows of one column,
// its byte p the pair of rows (2p, 2p + 1) that the A layout wants along k (one byte permute and
// one LOP3 put it in an mma register), so mma h of word w takes rows 8w + 4h .. 8w + 4h + 3 of
// the lane's 32, and its B (the activations of those rows: lane g those of A's row g, zeros for
// rows past m; MR = 16 takes a second mma for rows 8..15) is 8 bytes of that row as they lie in
// memory. About 2.4 instructions per weight, whatever the rows of A (up to 8). The routine needs K, group, first and first + rows to be multiples of 32 and `a`, `q`
// 16-byte aligned (a lane's 32 rows are then all inside or all outside the range, and in one
// quantization group), and A's rows 16-byte aligned; otherwise it sums value by value. Columns
// past N read no memory and come out 0.
template <class H> struct Gemv4KStep {
    uint4 w[2];     // rows 32c .. 32c + 31 of the chunk, columns g and g + 8 of the group
    uint32_t s[2];  // their scales, in both halves (0 where the lane's rows or columns are out)
};

template <class H, bool SIGNED, int BN, int SLICES, int LD, int MR = 1, bool GUARD = true>
TILEC_DEV void gemv_dequant4_mma_kmajor(const typename H::storage* a, int64_t lda, int64_t m,
                                        const uint8_t* q, const typename H::storage* s, int64_t N,
                                        int64_t K, int64_t SK, int64_t first, int64_t rows,
                                        int64_t col0, int64_t group, uint32_t bias, float* dst) {
    constexpr int NGRP = BN / 16, D = TILEC_GEMV_DEPTH, NT = GemvRows<MR>::NT;
    const int mr = m < MR ? (int)m : MR;  // A's rows given (the rest come out 0)
    static_assert(BN % 16 == 0, "16-column groups");
    const int lane = (int)threadIdx.x % 32, warp = (int)threadIdx.x / 32, g = lane >> 2, c = lane & 3;
    const int64_t end = first + rows, c0 = first >> 7;
    const int64_t chunks = rows > 0 ? ((end + 127) >> 7) - c0 : 0;
    const int64_t per = (chunks + SLICES - 1) / SLICES;  // chunks per warp
    const int64_t cb = c0 + warp * per, ce = cb + per < c0 + chunks ? cb + per : c0 + chunks;
    const int64_t half = (K + 1) >> 1;  // bytes per column of q
    const bool fast = K % 32 == 0 && group % 32 == 0 && first % 32 == 0 && end % 32 == 0 &&
                      K < (int64_t(1) << 30) &&  // rows and row counters in 32 bits below
                      (reinterpret_cast<uintptr_t>(a) & 15) == 0 && (mr == 1 || lda % 8 == 0) &&
                      (reinterpret_cast<uintptr_t>(q) & 15) == 0;
    if (!fast) {  // value by value (the rows of the warp's chunks)
        const float base = H::load((uint16_t)(Pair16<H>::magic & 0xffffu)) + (SIGNED ? 8.0f : 0.0f);
        const float z = H::load((uint16_t)bias) - base;  // bias = MAGIC + zero (+ 8 if signed)
        const int64_t rb = cb * 128 > first ? cb * 128 : first, re = ce * 128 < end ? ce * 128 : end;
        // (a row of A at a time: each weight is dequantized again for each row)
        for (int i = 0; i < MR; ++i)
            for (int j = lane; j < BN; j += 32) {
                const int64_t n = col0 + j;
                float sum = 0.0f;
                if (n < N && i < mr) {
                    for (int64_t r = rb; r < re; ++r) {
                        const int32_t v = SIGNED ? load_i4(q, n, r, K) : load_u4(q, n, r, K);
                        const float w = H::load(H::store(((float)v - z) * H::load(s[n * SK + r / group])));
                        sum = fma_acc(H::load(a[i * lda + r]), w, sum);
                    }
                }
                dst[(warp * MR + i) * LD + j] = sum;
            }
        return;
    }
    // steps (column group gg, chunk ch), the chunks of one group in order (a column's 64-byte
    // pieces one after the other), then the next group; a ring of D steps in flight. The lane's
    // addresses: q at its first row of chunk 0 in column g of group 0, advanced by offsets.
    const int nch = ce > cb ? (int)(ce - cb) : 0;
    const int first32 = (int)first, end32 = (int)end;
    // the next step to load (group pg, chunk cb + pc) and the lane's addresses for it: its 16
    // bytes of column g of the group (column g + 8: 8 columns further), the scales' row, and the
    // quantization group (32-row pieces counted, no division in the loop)
    const int gq = (int)(group >> 5);  // 32-row pieces per quantization group
    const int piece0 = (int)(((cb * 128 + 32 * c) >> 5) % gq), grp0 = (int)(((cb * 128 + 32 * c) >> 5) / gq);
    const int64_t col8 = 8 * half, scol8 = 8 * SK;
    const uint8_t* qn = q + (col0 + g) * half + ((cb * 128 + 32 * c) >> 1);
    const typename H::storage* sn = s + (col0 + g) * SK;
    int pg = 0, piece = piece0, grp = grp0, pc = 0;
    const int r0 = (int)(cb * 128 + 32 * c);
    int rn = r0;  // the lane's first row of the step
    auto load = [&](Gemv4KStep<H>& st) {
        const int64_t n = col0 + pg * 16 + g;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            st.w[h] = make_uint4(0u, 0u, 0u, 0u);
            st.s[h] = 0u;
            if (!GUARD || (rn >= first32 && rn < end32 && n + 8 * h < N)) {
                const uint8_t* p = qn + h * col8;
#if TILEC_GEMV_PREFETCH
                asm("ld.global.nc.L2::" TILEC_STR(TILEC_GEMV_PREFETCH) "B.v4.u32 {%0, %1, %2, %3}, [%4];"
                    : "=r"(st.w[h].x), "=r"(st.w[h].y), "=r"(st.w[h].z), "=r"(st.w[h].w) : "l"(p));
#else
                st.w[h] = *reinterpret_cast<const uint4*>(p);
#endif
                const uint32_t v = (uint32_t)sn[h * scol8 + grp];
                st.s[h] = v | (v << 16);
            }
        }
        qn += 64;
        rn += 128;
        for (piece += 4; piece >= gq; piece -= gq) ++grp;
        if (++pc == nch) {  // the group's last chunk: the next group, from chunk cb again
            pc = 0;
            ++pg;
            qn += 16 * half - nch * 64;
            rn = r0;
            sn += 16 * SK;
            piece = piece0;
            grp = grp0;
        }
    };
    Gemv4KStep<H> ring[D];
#pragma unroll
    for (int j = 0; j < D; ++j)
        if (nch > 0 && pg < NGRP) load(ring[j]);
#pragma unroll 1
    for (int gg = 0; gg < NGRP; ++gg) {
        float acc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
        // the lane's activations of the chunk: those of A's row g (+ 8 nt), if given
        const typename H::storage* an = a + g * lda + r0;
        bool given[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) given[nt] = g + 8 * nt < mr;
        for (int ch = 0, r = r0; ch < nch; ++ch, r += 128, an += 128) {
            const Gemv4KStep<H> cur = ring[0];
#pragma unroll
            for (int j = 0; j + 1 < D; ++j) ring[j] = ring[j + 1];
            if (pg < NGRP) load(ring[D - 1]);
            // the chunk's activations: rows 32c .. 32c + 31 (zeros where the lane's rows are out)
            const bool in = !GUARD || (r >= first32 && r < end32);
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                uint32_t bw[NT][4];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const uint4 b4 = in && given[nt]
                                         ? *reinterpret_cast<const uint4*>(an + nt * 8 * lda + 8 * w)
                                         : make_uint4(0u, 0u, 0u, 0u);
                    bw[nt][0] = b4.x; bw[nt][1] = b4.y; bw[nt][2] = b4.z; bw[nt][3] = b4.w;
                }
                uint32_t wd[2] = {w == 0 ? cur.w[0].x : w == 1 ? cur.w[0].y : w == 2 ? cur.w[0].z : cur.w[0].w,
                                  w == 0 ? cur.w[1].x : w == 1 ? cur.w[1].y : w == 2 ? cur.w[1].z : cur.w[1].w};
                if (SIGNED) { wd[0] ^= 0x88888888u; wd[1] ^= 0x88888888u; }  // q + 8
                const uint32_t hi[2] = {wd[0] >> 4, wd[1] >> 4};
#pragma unroll
                for (int h = 0; h < 2; ++h) {  // rows 8w + 4h .. + 3: bytes 2h, 2h + 1 of the words
                    uint32_t A[4];  // rows g, g + 8 (columns g, g + 8); k 2c.. and 2c + 8..
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int p = 2 * h + (e >> 1), col = e & 1;
                        A[e] = dequant_pair<H>(__byte_perm(wd[col], hi[col], p | ((p + 4) << 8)),
                                               bias, cur.s[col]);
                    }
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) Mma<H>::run(acc[nt], A, bw[nt] + 2 * h);
                }
            }
        }
        // C column 2c + e of n8 tile nt is A's row 8 nt + 2c + e: lane (g, c) holds it for
        // columns g and g + 8 of the group
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = nt * 8 + 2 * c + e;
                if (i < MR) {
                    dst[(warp * MR + i) * LD + gg * 16 + g] = acc[nt][e];
                    dst[(warp * MR + i) * LD + gg * 16 + g + 8] = acc[nt][e + 2];
                }
            }
    }
}

// ---- reductions across the threads that share a row -------------------------------------------

// whether `p` holds for any thread of the warp (all 32 lanes take part)
TILEC_DEV bool warp_any(bool p) { return __any_sync(0xffffffffu, p) != 0; }

TILEC_DEV float shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
TILEC_DEV double shfl_xor(double v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
TILEC_DEV int64_t shfl_xor(int64_t v, int m) { return (int64_t)__shfl_xor_sync(0xffffffffu, (long long)v, m); }
template <typename T> TILEC_DEV T shfl_xor(T v, int m) { return (T)__shfl_xor_sync(0xffffffffu, (int)v, m); }

// Butterfly over the lanes l ^ 1, l ^ 2, ..., l ^ (width / 2): every lane gets the same value.
template <class Op, int WIDTH, typename T> TILEC_DEV T warp_allreduce(T v) {
#pragma unroll
    for (int m = 1; m < WIDTH; m *= 2) v = Op::apply(v, shfl_xor(v, m));
    return v;
}

// The row values of an mma accumulator: each is held by the 4 lanes of a quad (one warp per row).
template <class Op, int N, typename T> TILEC_DEV void quad_allreduce(T (&rows)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) rows[i] = warp_allreduce<Op, 4>(rows[i]);
}

// One value per thread, combined over the whole block of THREADS threads; every thread gets the
// result (warps combined in a fixed order, so it is the same bits in every thread and run).
template <class Op, int THREADS, typename T> TILEC_DEV T block_allreduce(T v) {
    v = warp_allreduce<Op, 32>(v);
    if (THREADS <= 32) return v;
    __shared__ T scratch[THREADS / 32];
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) scratch[warp] = v;
    __syncthreads();
    T r = scratch[0];
#pragma unroll
    for (int w = 1; w < THREADS / 32; ++w) r = Op::apply(r, scratch[w]);
    __syncthreads();  // scratch is free for the next reduction
    return r;
}

// The column values of a block's vector tile (a column reduction): thread t holds VEC values of
// its columns, and the threads t % PER_ROW + k * PER_ROW (the tile's other rows) hold partials of
// the same columns. Combined so that every one of them holds the totals: lanes by shuffles, then
// warps in a fixed order through shared memory (the same bits in every thread and run): a
// thread per value combines the warps' partials, and every thread reads its totals back (every
// thread combining all the warps' partials itself kept the shared-memory pipe busy: ncu's
// mio_throttle the top stall of a softmax over 256 channels; 0.201 -> 0.138 ms on an H100).
template <class Op, int THREADS, int PER_ROW, typename T, int VEC>
TILEC_DEV void block_col_allreduce(T (&v)[VEC]) {
    static_assert(PER_ROW <= 32 && 32 % PER_ROW == 0, "a row of the tile within one warp");
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
#pragma unroll
        for (int m = PER_ROW; m < 32 && m < THREADS; m *= 2) v[e] = Op::apply(v[e], shfl_xor(v[e], m));
    }
    if constexpr (THREADS > 32) {
        __shared__ T scratch[THREADS / 32][PER_ROW * VEC];
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        if (lane < PER_ROW) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) scratch[warp][lane * VEC + e] = v[e];
        }
        __syncthreads();
        for (int i = threadIdx.x; i < PER_ROW * VEC; i += THREADS) {  // (a value per thread)
            T r = scratch[0][i];
#pragma unroll
            for (int w = 1; w < THREADS / 32; ++w) r = Op::apply(r, scratch[w][i]);
            scratch[0][i] = r;
        }
        __syncthreads();
        const int c = lane % PER_ROW * VEC;
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[e] = scratch[0][c + e];
        __syncthreads();  // scratch is free for the next reduction
    }
}

// ---- host-side helpers for launchers ----------------------------------------------------------
// The plain entry point's workspace, stream-ordered (the _with_workspace entry point takes the
// caller's and allocates nothing).
inline void* workspace_alloc(size_t bytes, cudaStream_t stream) {
    void* p = nullptr;
    return cudaMallocAsync(&p, bytes, stream) == cudaSuccess ? p : nullptr;
}
inline void workspace_free(void* p, cudaStream_t stream) { cudaFreeAsync(p, stream); }

// Raise a kernel's dynamic shared memory limit above the default 48 KiB, once per device
// (`done` is the kernel's own bitmask of devices). Returns a CUDA error code.
template <typename F>
inline cudaError_t allow_smem(F* kernel, size_t bytes, std::atomic<unsigned>& done) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    const unsigned bit = 1u << (dev & 31);
    if (done.load(std::memory_order_relaxed) & bit) return cudaSuccess;
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_relaxed);
    return e;
}

// ==== Dependent launches (compute capability 9.0 on) =========================================
// A call's kernels after its first are launched as programmatic dependent launches where the
// device and the kernel's code allow it: the next kernel's blocks are launched while the last
// blocks of the one before still run (each block of that one has said so at its start:
// allow_dependents), and wait at their own start (wait_for_prior) until it has finished and its
// writes are visible. The wait comes before any access to memory, so the kernels' order is
// exactly that of plain launches; what the overlap saves is the second launch's latency.
TILEC_DEV void wait_for_prior() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
TILEC_DEV void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether `kernel` may be launched as a dependent launch on the current device: compute
// capability 9.0 or later, and the kernel's code compiled for it (its PTX version, so that code
// compiled for sm_80 and run on a later GPU, which has no wait_for_prior, is launched plainly).
// Once per device for each kernel (`known`: 0 not asked yet, 1 no, 2 yes).
template <typename F>
inline bool dependent_launch(F* kernel, std::atomic<int>* known) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    std::atomic<int>& k = known[dev & 63];
    int v = k.load(std::memory_order_relaxed);
    if (v == 0) {
        int major = 0;
        cudaFuncAttributes a;
        const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
                            cudaSuccess && major >= 9 &&
                        cudaFuncGetAttributes(&a, kernel) == cudaSuccess && a.ptxVersion >= 90;
        v = ok ? 2 : 1;
        k.store(v, std::memory_order_relaxed);
    }
    return v == 2;
}

#if CUDART_VERSION >= 12000
// cudaLaunchKernelEx's configuration: `grid` blocks of `threads`, `smem` bytes of dynamic
// shared memory, on `stream`, with the `n` attributes at `attrs`.
inline cudaLaunchConfig_t launch_config(dim3 grid, unsigned threads, size_t smem,
                                        cudaStream_t stream, cudaLaunchAttribute* attrs,
                                        unsigned n) {
    cudaLaunchConfig_t cfg = {};  // (value-initialized: no memset of a type with constructors)
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attrs;
    cfg.numAttrs = n;
    return cfg;
}

// The attribute that makes a launch a programmatic dependent one.
inline cudaLaunchAttribute dependent_attribute() {
    cudaLaunchAttribute a = {};
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
    return a;
}
#endif

// Launch `kernel` after the call's previous kernel in `stream`: a programmatic dependent launch
// where dependent_launch allows it (CUDA 12 and later), else a plain one. A CUDA error code.
template <typename F, typename... Args>
inline cudaError_t launch_after(F* kernel, dim3 grid, unsigned threads, size_t smem,
                                cudaStream_t stream, std::atomic<int>* known, Args... args) {
#if CUDART_VERSION >= 12000
    if (dependent_launch(kernel, known)) {
        cudaLaunchAttribute attr[1] = {dependent_attribute()};
        const cudaLaunchConfig_t cfg = launch_config(grid, threads, smem, stream, attr, 1);
        return cudaLaunchKernelEx(&cfg, kernel, args...);
    }
#else
    (void)known;
#endif
    kernel<<<grid, threads, smem, stream>>>(args...);
    return cudaGetLastError();
}

// ==== Hopper (sm_90a): mbarriers, the tensor memory accelerator (TMA), wgmma ================
// What the warp-specialized GEMM kernels tilec builds for --arch sm_90a use (docs/CUDA.md,
// "Hopper"). A producer warp fills `stages` shared-memory stages by TMA; each stage completes on
// its `full` mbarrier (the bytes the copies wrote); consumer warpgroups multiply a full stage with
// wgmma and arrive on its `empty` mbarrier once their wgmmas have read it, which frees the stage
// for the producer. Phases: the i-th use of a stage (i = k tile / stages) waits for parity i & 1.
// Shared tiles are in the 128-byte swizzle of TMA and wgmma: rows of 64 16-bit values (128
// bytes), 16-byte chunks XOR-ed with the row index mod 8, each stage 1024-byte aligned.
// Outside sm_90a device code these compile to nothing (their kernels are never built there).
// (CUDA 12 and later: tensor maps and sm_90a exist from 12.0 on; older toolkits build the rest)
#if CUDART_VERSION >= 12000
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TILEC_SM90A 1
#endif

namespace sm90 {

TILEC_DEV uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

TILEC_DEV void mbar_init(uint64_t* bar, uint32_t arrivals) {
#ifdef TILEC_SM90A
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(bar)), "r"(arrivals)
                 : "memory");
#endif
}

// Makes initialized mbarriers visible to the copy engine (then a block barrier for the threads).
TILEC_DEV void mbar_init_fence() {
#ifdef TILEC_SM90A
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// One arrival that also says `bytes` more will land on the barrier (the stage's TMA copies).
TILEC_DEV void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#ifdef TILEC_SM90A
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
#endif
}

TILEC_DEV void mbar_arrive(uint64_t* bar) {
#ifdef TILEC_SM90A
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_addr(bar)) : "memory");
#endif
}

// Wait until the barrier's phase of parity `parity` has completed.
TILEC_DEV void mbar_wait(uint64_t* bar, uint32_t parity) {
#ifdef TILEC_SM90A
    uint32_t done = 0;
    do {
        asm volatile("{\n .reg .pred p;\n"
                     " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    } while (!done);
#endif
}

// TMA: a box of the tensor `map` describes, at element coordinates (innermost first; outside
// the tensor the box reads zeros), into shared `dst`; completes `bar`'s expected bytes.
TILEC_DEV void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t x, int32_t y) {
#ifdef TILEC_SM90A
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4}], [%2];"
                 :: "r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)),
                    "r"(x), "r"(y) : "memory");
#endif
}

TILEC_DEV void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t x, int32_t y,
                           int32_t z) {
#ifdef TILEC_SM90A
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5}], [%2];"
                 :: "r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)),
                    "r"(x), "r"(y), "r"(z) : "memory");
#endif
}

// The same, written to the same shared-memory offset of every block of the cluster in `mask`
// (bit r: block rank r), completing each one's mbarrier at `bar`'s offset.
TILEC_DEV void tma_load_2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t x,
                                     int32_t y, uint16_t mask) {
#ifdef TILEC_SM90A
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;"
                 :: "r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)),
                    "r"(x), "r"(y), "h"(mask) : "memory");
#endif
}

// Thread block clusters: this block's rank, a barrier of every thread of the cluster, and an
// arrival on the mbarrier at `bar`'s offset in block `rank` of the cluster.
TILEC_DEV uint32_t cluster_rank() {
    uint32_t r = 0;
#ifdef TILEC_SM90A
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    return r;
}

TILEC_DEV void cluster_sync() {
#ifdef TILEC_SM90A
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

TILEC_DEV void mbar_arrive_remote(uint64_t* bar, uint32_t rank) {
#ifdef TILEC_SM90A
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(bar)), "r"(rank));
    // (release at the block's scope, the default: the consumers only read the stage, so no
    // cluster-wide fence is needed before the arrival)
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
#endif
}

// TMA stores: the box of the tensor `map` describes at element coordinates (innermost first;
// the part outside the tensor is not written) from shared `src`, in the calling thread's current
// bulk group; bulk_commit closes the group, bulk_wait_read<N> waits until at most N of the
// thread's groups still read their shared memory, bulk_wait<N> until at most N are unfinished.
TILEC_DEV void tma_store_2d(const CUtensorMap* map, const void* src, int32_t x, int32_t y) {
#ifdef TILEC_SM90A
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
                 :: "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(src)), "r"(x), "r"(y)
                 : "memory");
#endif
}

TILEC_DEV void tma_store_3d(const CUtensorMap* map, const void* src, int32_t x, int32_t y,
                            int32_t z) {
#ifdef TILEC_SM90A
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];"
                 :: "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(src)), "r"(x), "r"(y),
                    "r"(z) : "memory");
#endif
}

TILEC_DEV void bulk_commit() {
#ifdef TILEC_SM90A
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

template <int N>
TILEC_DEV void bulk_wait_read() {
#ifdef TILEC_SM90A
    asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(N) : "memory");
#endif
}

template <int N>
TILEC_DEV void bulk_wait() {
#ifdef TILEC_SM90A
    asm volatile("cp.async.bulk.wait_group %0;" :: "n"(N) : "memory");
#endif
}

// The element offset of (row, col) in a tile of 128-byte rows in TMA's 128-byte swizzle (16-byte
// chunk c of row r at chunk c ^ (r % 8); the tile 1024-byte aligned), for E-byte elements.
template <int E>
TILEC_DEV int sw128(int row, int col) {
    const int byte = col * E;
    return (row * 128 + ((((byte >> 4) ^ row) & 7) << 4) + (byte & 15)) / E;
}

// A pair of 16-bit values as one 32-bit word (the first in the low half, as memory holds them),
// and the word written back to shared memory: a deferred epilogue keeps a tile's packed values
// in registers until it stores them.
TILEC_DEV uint32_t pack16x2(const uint16_t (&v)[2]) {
    return (uint32_t)v[0] | ((uint32_t)v[1] << 16);
}
TILEC_DEV void store32(uint16_t* p, uint32_t w) {
    *reinterpret_cast<uint32_t*>(p) = w;
}
// x, opaque to the optimizer: what derives from it is computed where it is used. A deferred
// epilogue's swizzled staging offsets (16 per thread) would otherwise be hoisted out of the tile
// loop and held through the K loop beside the accumulators and the pending tile, and spill.
TILEC_DEV int opaque(int x) {
    asm volatile("" : "+r"(x));
    return x;
}

TILEC_DEV void prefetch_tensor_map(const CUtensorMap* map) {
#ifdef TILEC_SM90A
    asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// Registers move from the producer warpgroup to the consumers (the kernel's launch bounds cap
// them at entry; each warpgroup's role is one branch).
template <int R>
TILEC_DEV void setmaxnreg_dec() {
#ifdef TILEC_SM90A
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(R));
#endif
}
template <int R>
TILEC_DEV void setmaxnreg_inc() {
#ifdef TILEC_SM90A
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(R));
#endif
}

// A barrier of the consumer warpgroups alone (the producer never reaches it): named barrier
// `id` (1, or 1 + the warpgroup for one ping-pong warpgroup) of THREADS threads.
template <int THREADS>
TILEC_DEV void consumer_sync(int id) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "n"(THREADS) : "memory");
}

// Two consumer warpgroups taking turns to issue their products (attention's ping-pong):
// warpgroup wg waits for its turn (named barrier 2 + wg: its own 128 threads and the other
// warpgroup's 128 arrivals), and passes the turn on (arrives at the other's barrier).
TILEC_DEV void turn_wait(int wg) {
    asm volatile("bar.sync %0, 256;" :: "r"(2 + wg) : "memory");
}
TILEC_DEV void turn_pass(int wg) {
    asm volatile("bar.arrive %0, 256;" :: "r"(3 - wg) : "memory");
}

// A consumer warpgroup's TMA-store staging (its 128 threads, named barrier `bar`): before they
// write a buffer, its first thread waits until at most N of its stores still read their buffers
// (the buffer's previous store is done with it); after, their writes are made visible to the
// TMA unit before that thread stores the buffer.
template <int N>
TILEC_DEV void staging_free(int bar) {
    if (threadIdx.x % 128 == 0) bulk_wait_read<N>();
    consumer_sync<128>(bar);
}

TILEC_DEV void staging_ready(int bar) {
#ifdef TILEC_SM90A
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
    consumer_sync<128>(bar);
}

// wgmma matrix descriptors of a 128-byte-swizzled shared tile: start address, leading and
// stride byte offsets (>> 4), swizzle mode 1 (128 bytes) in bits 62-63. K-major (rows of 64
// K values): 8-row groups 1024 bytes apart, a k-step of 16 starts 32 bytes further. MN-major
// (rows of 64 M or N values, panels of 64 columns `panel` bytes apart): 8-row (8 K) groups
// 1024 bytes apart.
TILEC_DEV uint64_t desc_sw128(const void* tile, uint32_t lead) {
    return (uint64_t)((smem_addr(tile) & 0x3FFFF) >> 4) | ((uint64_t)(lead >> 4) << 16) |
           ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

TILEC_DEV void wgmma_fence() {
#ifdef TILEC_SM90A
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
TILEC_DEV void wgmma_commit() {
#ifdef TILEC_SM90A
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N>
TILEC_DEV void wgmma_wait() {
#ifdef TILEC_SM90A
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
#endif
}

// Keeps the compiler from moving accesses of the accumulators across a wgmma fence or wait
// (the asynchronous wgmma writes them behind its back).
template <int N>
TILEC_DEV void fence_regs(float* d) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
// ... and the 16-bit pairs of an A operand in registers: they stay where the wgmma reads them,
// untouched, until this point (after its wait)
template <int N>
TILEC_DEV void fence_regs(uint32_t* a) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(a[i]) :: "memory");
}

// wgmma m64nNk16's accumulators: N / 2 f32 registers of this thread (d[0] ..), as the list
// in the PTX string (TILEC_WGMMA_D<n>) and as the asm outputs (TILEC_WGMMA_OUT<n>).
#define TILEC_WGMMA_D32  \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define TILEC_WGMMA_OUT32  \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define TILEC_WGMMA_D64  \
    TILEC_WGMMA_D32 ","  \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define TILEC_WGMMA_OUT64  \
    TILEC_WGMMA_OUT32,  \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
// (88: attention's 176-key tiles; 96: 192-column GEMM tiles)
#define TILEC_WGMMA_D88  \
    TILEC_WGMMA_D64 ","  \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"  \
    "%80, %81, %82, %83, %84, %85, %86, %87"
#define TILEC_WGMMA_OUT88  \
    TILEC_WGMMA_OUT64,  \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),  \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),  \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
#define TILEC_WGMMA_D96  \
    TILEC_WGMMA_D88 ","  \
    "%88, %89, %90, %91, %92, %93, %94, %95"
#define TILEC_WGMMA_OUT96  \
    TILEC_WGMMA_OUT88,  \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define TILEC_WGMMA_D128  \
    TILEC_WGMMA_D96 ","  \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"  \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define TILEC_WGMMA_OUT128  \
    TILEC_WGMMA_OUT96,  \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),  \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),  \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),  \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// D[64 x W] (f32, this warpgroup's registers: R of them, the lists TILEC_WGMMA_D<R> and
// TILEC_WGMMA_OUT<R>) = A * B + (scale_d ? D : 0), K values per step: A and B by shared-memory
// descriptors (operands A and B of the asm, then P: scale_d); TRANS: the operands' transposes
// (16-bit types: A MN-major, rows of M contiguous, when TA; B MN-major, rows of N contiguous,
// when TB; fp8 takes none: K-major only).
#define TILEC_WGMMA_SS_ASM(W, R, A, B, P, K, DT, TRANS)  \
    asm volatile(  \
        "{\n .reg .pred p;\n setp.ne.b32 p, " P ", 0;\n"  \
        " wgmma.mma_async.sync.aligned.m64n" W "k" K ".f32." DT "." DT " {" TILEC_WGMMA_D##R "},"  \
        " " A ", " B ", p, 1, 1" TRANS ";\n}\n"  \
        : TILEC_WGMMA_OUT##R : "l"(a), "l"(b), "r"(scale_d), "n"(TB), "n"(TA))
#define TILEC_WGMMA_N64(K, DT, TRANS) TILEC_WGMMA_SS_ASM("64", 32, "%32", "%33", "%34", K, DT, TRANS)
#define TILEC_WGMMA_N128(K, DT, TRANS) TILEC_WGMMA_SS_ASM("128", 64, "%64", "%65", "%66", K, DT, TRANS)
// (attention's 176-key tiles)
#define TILEC_WGMMA_N176(K, DT, TRANS) TILEC_WGMMA_SS_ASM("176", 88, "%88", "%89", "%90", K, DT, TRANS)
#define TILEC_WGMMA_N192(K, DT, TRANS) TILEC_WGMMA_SS_ASM("192", 96, "%96", "%97", "%98", K, DT, TRANS)
#define TILEC_WGMMA_N256(K, DT, TRANS)  \
    TILEC_WGMMA_SS_ASM("256", 128, "%128", "%129", "%130", K, DT, TRANS)

// The operand types of a wgmma: 16-bit floats (k-steps of 16), fp8 (k-steps of 32) and f32 read
// as tf32 (k-steps of 8; the tensor cores ignore each value's low 13 mantissa bits): the same 32
// bytes of each row.
enum WgmmaType { WG_F16, WG_BF16, WG_E4M3, WG_E5M2, WG_TF32 };
// Bytes of one value of a WgmmaType.
constexpr TILEC_DEV int wgmma_bytes(int dt) { return dt <= WG_BF16 ? 2 : dt == WG_TF32 ? 4 : 1; }

// The wgmma of one k-step for a tile of N columns (64, 128, 176, 192 or 256) and the operand type DT:
// sm_90a code (elsewhere a stub that traps: the launcher runs it on H100/H200 devices alone).
// (%35, %67, %91, %99, %131: the TB operand of each width's list; TA the next)
#define TILEC_WGMMA_SS(N_)  \
    if constexpr (DT == WG_F16) TILEC_WGMMA_N##N_("16", "f16", TILEC_WGMMA_TB##N_);  \
    else if constexpr (DT == WG_BF16) TILEC_WGMMA_N##N_("16", "bf16", TILEC_WGMMA_TB##N_);  \
    else if constexpr (DT == WG_E4M3) TILEC_WGMMA_N##N_("32", "e4m3", "");  \
    else if constexpr (DT == WG_E5M2) TILEC_WGMMA_N##N_("32", "e5m2", "");  \
    else TILEC_WGMMA_N##N_("8", "tf32", "");
#define TILEC_WGMMA_TB64 ", %36, %35"
#define TILEC_WGMMA_TB128 ", %68, %67"
#define TILEC_WGMMA_TB176 ", %92, %91"
#define TILEC_WGMMA_TB192 ", %100, %99"
#define TILEC_WGMMA_TB256 ", %132, %131"

template <int N, int TA, int TB, int DT>
TILEC_DEV void wgmma(float* d, uint64_t a, uint64_t b, int scale_d) {
    static_assert(N == 64 || N == 128 || N == 176 || N == 192 || N == 256,
                  "wgmma tiles of 64, 128, 176, 192 or 256 columns");
    static_assert(DT <= WG_BF16 || (TA == 0 && TB == 0), "fp8 and tf32 wgmma operands are K-major");
#ifdef TILEC_SM90A
    if constexpr (N == 256) {
        TILEC_WGMMA_SS(256)
    } else if constexpr (N == 192) {
        TILEC_WGMMA_SS(192)
    } else if constexpr (N == 176) {
        TILEC_WGMMA_SS(176)
    } else if constexpr (N == 128) {
        TILEC_WGMMA_SS(128)
    } else {
        TILEC_WGMMA_SS(64)
    }
#else
    (void)d; (void)a; (void)b; (void)scale_d;
    __trap();
#endif
}

// D[64 x W] (f32, this warpgroup's registers: R of them) = A * B + (scale_d ? D : 0), K = 16:
// A from registers (a[0..3]: this thread's 16-bit pairs, in the accumulator's layout; with B's
// descriptor, the operands AB of the asm), B by a shared-memory descriptor, MN-major (rows of N
// contiguous) when TB (operand T); P: scale_d; DT "f16" or "bf16".
#define TILEC_WGMMA_RS_ASM(W, R, AB, P, T, DT)  \
    asm volatile(  \
        "{\n .reg .pred p;\n setp.ne.b32 p, " P ", 0;\n"  \
        " wgmma.mma_async.sync.aligned.m64n" W "k16.f32." DT "." DT " {" TILEC_WGMMA_D##R "},"  \
        AB ", p, 1, 1, " T ";\n}\n"  \
        : TILEC_WGMMA_OUT##R  \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d), "n"(TB))
#define TILEC_WGMMA_RS_N64(DT)  \
    TILEC_WGMMA_RS_ASM("64", 32, " {%32, %33, %34, %35}, %36", "%37", "%38", DT)
#define TILEC_WGMMA_RS_N128(DT)  \
    TILEC_WGMMA_RS_ASM("128", 64, " {%64, %65, %66, %67}, %68", "%69", "%70", DT)
#define TILEC_WGMMA_RS_N256(DT)  \
    TILEC_WGMMA_RS_ASM("256", 128, " {%128, %129, %130, %131}, %132", "%133", "%134", DT)

// (16-bit types only: an A operand in registers holds 16-bit pairs)
#define TILEC_WGMMA_RS(N_)  \
    if constexpr (DT == WG_BF16) TILEC_WGMMA_RS_N##N_("bf16"); else TILEC_WGMMA_RS_N##N_("f16");

template <int N, int TB, int DT>
TILEC_DEV void wgmma_rs(float* d, const uint32_t* a, uint64_t b, int scale_d) {
    // (no 176-column form: attention's 176-key tiles multiply P V into D columns)
    static_assert(N == 64 || N == 128 || N == 256,
                  "wgmma tiles with A from registers: 64, 128 or 256 columns");
    static_assert(DT <= WG_BF16, "wgmma with A in registers: 16-bit types");
#ifdef TILEC_SM90A
    if constexpr (N == 256) {
        TILEC_WGMMA_RS(256)
    } else if constexpr (N == 128) {
        TILEC_WGMMA_RS(128)
    } else {
        TILEC_WGMMA_RS(64)
    }
#else
    (void)d; (void)a; (void)b; (void)scale_d;
    __trap();
#endif
}
#undef TILEC_WGMMA_SS
#undef TILEC_WGMMA_RS
#undef TILEC_WGMMA_TB64
#undef TILEC_WGMMA_TB128
#undef TILEC_WGMMA_TB176
#undef TILEC_WGMMA_TB192
#undef TILEC_WGMMA_TB256
#undef TILEC_WGMMA_N64
#undef TILEC_WGMMA_RS_N64
#undef TILEC_WGMMA_N128
#undef TILEC_WGMMA_RS_N128
#undef TILEC_WGMMA_N176
#undef TILEC_WGMMA_N192
#undef TILEC_WGMMA_N256
#undef TILEC_WGMMA_RS_N256
#undef TILEC_WGMMA_D32
#undef TILEC_WGMMA_OUT32
#undef TILEC_WGMMA_D64
#undef TILEC_WGMMA_OUT64
#undef TILEC_WGMMA_D128
#undef TILEC_WGMMA_OUT128
#undef TILEC_WGMMA_D88
#undef TILEC_WGMMA_OUT88
#undef TILEC_WGMMA_D96
#undef TILEC_WGMMA_OUT96

// Shared tiles of wgmma operands are rows of 128 bytes (one swizzle row): P elements of E, in
// k-steps of KS (32 bytes: 16 16-bit values, 32 fp8 or 8 f32); wider tiles are panels of P
// columns, one after the other.
template <typename E> constexpr __host__ __device__ int panel_cols() { return 128 / (int)sizeof(E); }
template <typename E> constexpr __host__ __device__ int kstep() { return 32 / (int)sizeof(E); }

// Descriptor d moved on by `bytes` (a multiple of 16 that keeps it in shared memory): its start
// address field is the address / 16 in the low 14 bits, which a shared memory address fits, so
// the offset adds to the low word without a carry out of the field. (One 32-bit add per wgmma
// operand instead of rebuilding the descriptor from the address.)
TILEC_DEV uint64_t desc_add(uint64_t d, uint32_t bytes) {
    return ((d >> 32) << 32) | (uint32_t)((uint32_t)d + (bytes >> 4));
}

// The offset (in elements) of k-step kk of an operand tile (A or B) in TMA's 128-byte swizzle
// from its start: MN-major (16-bit only), rows of K (M or N in panels of 64 columns); else ROWS
// rows of M or N (K in panels, ROWS * 128 bytes apart).
template <int ROWS, bool MN, typename E>
constexpr TILEC_DEV int operand_offset(int kk) {
    return MN ? kk * 16 * 64 : (kk / 4) * ROWS * panel_cols<E>() + (kk % 4) * kstep<E>();
}
// The descriptor's leading byte offset of an operand tile (A or B): MN-major, the distance of
// its panels of 64 columns (BK rows of 128 bytes); K-major, 16 (unused by the 128-byte swizzle).
template <int BK, bool MN> constexpr TILEC_DEV uint32_t operand_lead() { return MN ? BK * 128 : 16; }

// One consumer warpgroup's share of a tile product: its 64 rows of the A tile times the B tile
// (operand_offset), BK / KS wgmmas into acc (64 x BN, f32), which the first adds to (scale_d 1) or
// overwrites (0); DT the operands' WgmmaType, E their storage. A K-major: rows of BK values, in
// panels of A_ROWS rows each; A_MN (16-bit only: A read transposed, A.T @ B): the warpgroup's
// panel of 64 M columns, BK rows of K (its k-steps 16 rows apart, as B_MN's).
template <int BN, int BK, bool B_MN, int DT, int A_ROWS = 128, bool A_MN = false, typename E>
TILEC_DEV void wgmma_tile(float* acc, const E* a, const E* b, int scale_d = 1) {
    constexpr int P = panel_cols<E>(), KS = kstep<E>();
    static_assert(sizeof(E) == wgmma_bytes(DT), "the operand type's storage");
    static_assert(BK % KS == 0 && (BK <= P || BK % P == 0), "K in whole panels");
    static_assert(!A_MN || DT <= WG_BF16, "fp8 and tf32 wgmma operands are K-major");
    const uint64_t da = desc_sw128(a, operand_lead<BK, A_MN>());
    const uint64_t db = desc_sw128(b, operand_lead<BK, B_MN>());
#pragma unroll
    for (int kk = 0; kk < BK / KS; ++kk) {
        const int a_off = operand_offset<A_ROWS, A_MN, E>(kk);
        const int b_off = operand_offset<BN, B_MN, E>(kk);
        if constexpr (sizeof(E) == 1)  // fp8: each k-step's descriptors rebuilt from its address
            // (with constant offsets the fp8 GEMM measured 0.88-0.90x torch._scaled_mm at 8192^3
            // against 0.93-0.96x, the 16-bit kernels alike or faster: docs/PERFORMANCE.md)
            wgmma<BN, 0, B_MN ? 1 : 0, DT>(acc, desc_sw128(a + a_off, 16),
                                           desc_sw128(b + b_off, operand_lead<BK, B_MN>()),
                                           kk == 0 ? scale_d : 1);
        else
            wgmma<BN, A_MN ? 1 : 0, B_MN ? 1 : 0, DT>(acc, desc_add(da, a_off * sizeof(E)),
                                                      desc_add(db, b_off * sizeof(E)),
                                                      kk == 0 ? scale_d : 1);
    }
}

// acc += part, in f32, once part's wgmmas are complete (a wait): the promotion of a partial sum
// of fp8 products, which the tensor cores accumulate in less than f32 precision.
template <int N>
TILEC_DEV void promote(float* acc, float* part) {
    fence_regs<N>(part);
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] += part[i];
}

// The same with A from registers: a 16-bit fragment of this warpgroup's 64 x BK values in the
// accumulator's layout (attention's P), four 32-bit pairs per k-step.
template <int BN, int BK, bool B_MN, int DT>
TILEC_DEV void wgmma_tile_rs(float* acc, const uint32_t* a, const uint16_t* b) {
    static_assert(BK % 16 == 0 && (B_MN || BK <= 64 || BK % 64 == 0), "K in whole panels");
    const uint64_t db = desc_sw128(b, operand_lead<BK, B_MN>());
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)
        wgmma_rs<BN, B_MN ? 1 : 0, DT>(
            acc, a + 4 * kk, desc_add(db, operand_offset<BN, B_MN, uint16_t>(kk) * 2), 1);
}

}  // namespace sm90

// ---- host side of the Hopper kernels: tensor maps and the SM count --------------------------
// A tensor map describes a global tensor to the copy engine (address, extents, strides, box,
// swizzle). Encoding one costs host time, so launchers keep them in a small cache keyed by
// everything they encode. The driver's encoder is found through the runtime (no -lcuda).
struct TensorMapKey {
    const void* ptr;
    int dtype, rank;
    uint64_t dims[3], strides[2];
    uint32_t box[3];
    bool operator==(const TensorMapKey& o) const {
        return std::memcmp(this, &o, sizeof(*this)) == 0;
    }
};

// The L2 fetch size of a tensor map: 256 bytes where every row starts on a 128-byte line; 128
// where rows start inside one, since each 128-byte box row then spans two lines and 256-byte
// fetches around both cost L2 bandwidth (an H100, f16 C = A @ B of 4096 x 4088 x 4096: 275 us
// with 256, 241 us with 128; no difference where rows start on lines).
inline CUtensorMapL2promotion l2_promotion(const void* ptr, int rank, const uint64_t* strides) {
    bool lines = reinterpret_cast<uintptr_t>(ptr) % 128 == 0;
    for (int i = 0; i + 1 < rank; ++i) lines = lines && strides[i] % 128 == 0;
    return lines ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
}

// Fills `map` for a row-major tensor of `rank` <= 3 dims (dims[0] innermost, its row strides in
// bytes), boxes of `box` elements, 128-byte swizzle, zeros outside the tensor. False when the
// driver refuses it (an address or stride not a multiple of 16 bytes, a too-old driver).
inline bool tensor_map(CUtensorMap* map, const void* ptr, CUtensorMapDataType dtype, int rank,
                       const uint64_t* dims, const uint64_t* strides, const uint32_t* box) {
    typedef CUresult (*Encode)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                               const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                               const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                               CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    static std::mutex lock;
    static Encode encode = nullptr;
    enum { SLOTS = 32 };
    static TensorMapKey keys[SLOTS];
    static CUtensorMap maps[SLOTS];
    static int used = 0, next = 0;
    TensorMapKey key;
    std::memset(&key, 0, sizeof(key));  // (padding too: keys compare as bytes)
    key.ptr = ptr;
    key.dtype = (int)dtype;
    key.rank = rank;
    for (int i = 0; i < rank; ++i) {
        key.dims[i] = dims[i];
        key.box[i] = box[i];
        if (i + 1 < rank) key.strides[i] = strides[i];
    }
    std::lock_guard<std::mutex> guard(lock);
    for (int i = 0; i < used; ++i) {
        if (keys[i] == key) {
            *map = maps[i];
            return true;
        }
    }
    if (!encode) {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
        const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                               cudaEnableDefault, &found);
#else
        const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn,
                                                      cudaEnableDefault, &found);
#endif
        if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || !fn) return false;
        encode = reinterpret_cast<Encode>(fn);
    }
    cuuint32_t unit[3] = {1, 1, 1};
    if (encode(map, dtype, (cuuint32_t)rank, const_cast<void*>(ptr), dims, strides, box, unit,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               l2_promotion(ptr, rank, strides),
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return false;
    const int slot = used < SLOTS ? used++ : (next++ % SLOTS);
    keys[slot] = key;
    maps[slot] = *map;
    return true;
}

// The device's multiprocessors (a persistent grid's size), once per device.
inline int sm_count() {
    static std::atomic<int> counts[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    std::atomic<int>& c = counts[dev & 63];
    int n = c.load(std::memory_order_relaxed);
    if (n == 0) {
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
        c.store(n, std::memory_order_relaxed);
    }
    return n;
}

// Whether a pointer is 16-byte aligned (what TMA takes).
inline bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

// Whether the current device runs sm_90a code (compute capability 9.0: H100, H200), once per
// device: a library built for several architectures launches its Hopper kernels there alone.
inline bool sm90a_device() {
    static std::atomic<int> known[64];  // 0: not asked yet, 1: no, 2: yes
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    std::atomic<int>& k = known[dev & 63];
    int v = k.load(std::memory_order_relaxed);
    if (v == 0) {
        int major = 0, minor = 0;
        const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
                            cudaSuccess &&
                        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) ==
                            cudaSuccess;
        v = ok && major == 9 && minor == 0 ? 2 : 1;
        k.store(v, std::memory_order_relaxed);
    }
    return v == 2;
}

// Launch `kernel` on a persistent grid of clusters of 2 blocks: as many clusters as the device
// holds at once (cudaOccupancyMaxActiveClusters, once per device and kernel: `resident`), at
// most `clusters`; `after` (null for a call's first kernel): as launch_after. Returns a CUDA
// error code.
template <typename F, typename... Args>
inline cudaError_t launch_pairs(F* kernel, int64_t clusters, int threads, size_t smem,
                                cudaStream_t stream, std::atomic<int>* resident,
                                std::atomic<int>* after, Args... args) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    // (after: the launch follows another kernel of the call, a dependent one where it may be)
    attr[1] = dependent_attribute();
    cudaLaunchConfig_t cfg = launch_config(dim3(1), (unsigned)threads, smem, stream, attr, 1);
    int n = resident[dev & 63].load(std::memory_order_relaxed);
    if (n == 0) {
        cfg.gridDim = dim3(2 * (unsigned)sm_count());
        e = cudaOccupancyMaxActiveClusters(&n, kernel, &cfg);
        if (e != cudaSuccess) return e;
        if (n < 1) return cudaErrorInvalidConfiguration;
        resident[dev & 63].store(n, std::memory_order_relaxed);
    }
    const int64_t grid = clusters < n ? clusters : n;
    cfg.gridDim = dim3(2 * (unsigned)grid);
    if (after && dependent_launch(kernel, after)) cfg.numAttrs = 2;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}
#endif  // CUDART_VERSION >= 12000

}  // namespace tilec
#endif  // TILEC_CUDA_H
