// tilec_hip.h -- the tilec HIP device library (AMD GPUs: CDNA2 gfx90a, wave64).
//
// Every .hip file tilec emits for the HIP target includes this header (copied verbatim next to
// the generated sources). It needs only the HIP runtime and a GPU with MFMA instructions. It
// offers the same names as tilec_cuda.h's sm_80 part (the HIP renderer subclasses the CUDA one),
// implemented for AMD hardware:
//   * f16 / bf16 storage (raw 16-bit patterns) and conversions, vector loads and stores of up to
//     16 bytes with predicated tails;
//   * LDS tile layouts (16-byte chunks XOR-swizzled by row, or padded rows);
//   * tile copies global -> LDS in 16-byte chunks; the pipeline's copies issued ahead are loaded
//     into registers and written to LDS at the next wait (AMD has no cp.async);
//   * tile GEMMs on MFMA (v_mfma_f32_32x32x8f16 / _16x16x16f16 and their bf16_1k forms) with the
//     accumulator layout of tilec/ir/layout_mfma.py, and a scalar FMA path in the same layout;
//   * row reductions across the lanes that share a row (__shfl_xor over the 64 lanes of a
//     wavefront, then LDS across wavefronts);
//   * the elementwise math of fused expressions (NumPy semantics for NaN and integer division)
//     and the host helpers of the launchers.
// Generated code is compiled with -ffp-contract=off (elementwise code computes exactly what the
// program says); only the matrix products here fuse multiply-adds, explicitly.
#ifndef TILEC_HIP_H
#define TILEC_HIP_H

#include <hip/hip_runtime.h>

#include "tilec_checked.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <atomic>
#include <type_traits>

#define TILEC_DEV __device__ __forceinline__
#define TILEC_HD __host__ __device__ __forceinline__

namespace tilec {

constexpr int WAVE = 64;  // lanes of a wavefront (CDNA)

// ---- 16-bit floats: stored as raw bits (uint16_t), computed in float ----------------------
// f16 through clang's _Float16 (host and device: round to nearest even); bf16 by bit
// manipulation (its bits are the high half of an f32's).
TILEC_HD float f16_to_f32(uint16_t h) { return (float)__builtin_bit_cast(_Float16, h); }
TILEC_HD uint16_t f32_to_f16(float x) { return __builtin_bit_cast(uint16_t, (_Float16)x); }
TILEC_HD float bf16_to_f32(uint16_t h) { return __builtin_bit_cast(float, (uint32_t)h << 16); }
TILEC_HD uint16_t f32_to_bf16(float x) {
    const uint32_t u = __builtin_bit_cast(uint32_t, x);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return (uint16_t)(0x7fc0u | (u >> 16 & 0x8000u));
    return (uint16_t)((u + 0x7fffu + (u >> 16 & 1u)) >> 16);  // to nearest even
}
TILEC_DEV float round_f16(float x) { return f16_to_f32(f32_to_f16(x)); }
TILEC_DEV float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// A 16-bit value as the renderer passes it between a load and a store (its bits, tagged with the
// dtype): the HIP renderer computes every 16-bit operation in f32 and rounds once (the same
// bits as a 16-bit instruction: see tilec_cuda.h), so these only convert.
struct H16 { uint16_t b; };
struct B16 { uint16_t b; };
TILEC_DEV H16 as_f16(uint16_t b) { return H16{b}; }
TILEC_DEV B16 as_bf16(uint16_t b) { return B16{b}; }
TILEC_DEV H16 to_f16(float x) { return H16{f32_to_f16(x)}; }
TILEC_DEV B16 to_bf16(float x) { return B16{f32_to_bf16(x)}; }
TILEC_DEV float to_f32(H16 h) { return f16_to_f32(h.b); }
TILEC_DEV float to_f32(B16 h) { return bf16_to_f32(h.b); }
TILEC_DEV uint16_t bits(H16 h) { return h.b; }
TILEC_DEV uint16_t bits(B16 h) { return h.b; }

// ---- elementwise math of fused expressions: float and double overloads, NumPy semantics ------
// (the rest is tilec_gpu.h's) exp of f32: the hardware exp2 of x * log2 e (HIP's __expf: about
// 2 ulp for |x| < 20); the others are the ROCm device library's full-precision functions.
TILEC_DEV float exp(float x) { return __expf(x); }
TILEC_DEV float exp2(float x) { return exp2f(x); }
// 1 / x, correctly rounded (a row's reciprocal, computed once per row)
TILEC_DEV float recip(float x) { return __frcp_rn(x); }
TILEC_DEV double recip(double x) { return 1.0 / x; }
// 1 / y for y in [1, 2] (sigmoid's denominator): the hardware reciprocal for f32 (v_rcp_f32,
// within 1 ulp), a division for f64
TILEC_DEV float recip_1_2(float y) { return __builtin_amdgcn_rcpf(y); }
TILEC_DEV double recip_1_2(double y) { return 1.0 / y; }

}  // namespace tilec
// the device code both GPU libraries share (16-bit fragments and storage kinds, 4-bit loads,
// elementwise math, integer division and casts, reduction operators, host checks)
#include "tilec_gpu.h"
namespace tilec {

// ---- whole-vector loads and stores (tilec_gpu.h's load_vec and store_vec call them) ---------
// 16 bytes are one access (global_load_dwordx4). Words are clang vectors and integers, never
// HIP's uint4 struct: values move through 32-bit registers by shifts, which the compiler keeps in
// registers (a struct copied by memcpy stayed in scratch).
typedef uint32_t u32x4 __attribute__((ext_vector_type(4)));
template <> struct Word<1> { typedef uint8_t type; };
template <> struct Word<2> { typedef uint16_t type; };
template <> struct Word<4> { typedef uint32_t type; };
template <> struct Word<8> { typedef uint64_t type; };
template <> struct Word<16> { typedef u32x4 type; };
// The B bytes at p (aligned to min(B, 16)) as 32-bit pieces, and back.
template <int B> TILEC_DEV void load_words(uint32_t (&u)[B / 4], const void* p) {
    if constexpr (B >= 16) {
#pragma unroll
        for (int i = 0; i < B / 16; ++i) {
            const u32x4 w = reinterpret_cast<const u32x4*>(p)[i];
            u[4 * i] = w[0], u[4 * i + 1] = w[1], u[4 * i + 2] = w[2], u[4 * i + 3] = w[3];
        }
    } else if constexpr (B == 8) {
        const uint64_t w = *reinterpret_cast<const uint64_t*>(p);
        u[0] = (uint32_t)w, u[1] = (uint32_t)(w >> 32);
    } else {
        u[0] = *reinterpret_cast<const uint32_t*>(p);
    }
}
template <int B> TILEC_DEV void store_words(void* p, const uint32_t (&u)[B / 4]) {
    if constexpr (B >= 16) {
#pragma unroll
        for (int i = 0; i < B / 16; ++i)
            reinterpret_cast<u32x4*>(p)[i] = u32x4{u[4 * i], u[4 * i + 1], u[4 * i + 2], u[4 * i + 3]};
    } else if constexpr (B == 8) {
        *reinterpret_cast<uint64_t*>(p) = (uint64_t)u[0] | ((uint64_t)u[1] << 32);
    } else {
        *reinterpret_cast<uint32_t*>(p) = u[0];
    }
}
// Element v of type S of the bytes in u, and its bits put there (u starts zeroed).
template <typename S, int N> TILEC_DEV S unpack(const uint32_t (&u)[N], int v) {
    if constexpr (sizeof(S) == 8)
        return __builtin_bit_cast(S, (uint64_t)u[2 * v] | ((uint64_t)u[2 * v + 1] << 32));
    else if constexpr (sizeof(S) == 4)
        return __builtin_bit_cast(S, u[v]);
    else if constexpr (sizeof(S) == 2)
        return __builtin_bit_cast(S, (uint16_t)(u[v / 2] >> (16 * (v % 2))));
    else
        return __builtin_bit_cast(S, (uint8_t)(u[v / 4] >> (8 * (v % 4))));
}
template <typename S, int N> TILEC_DEV void pack(uint32_t (&u)[N], int v, S x) {
    if constexpr (sizeof(S) == 8) {
        const uint64_t b = __builtin_bit_cast(uint64_t, x);
        u[2 * v] = (uint32_t)b, u[2 * v + 1] = (uint32_t)(b >> 32);
    } else if constexpr (sizeof(S) == 4) {
        u[v] = __builtin_bit_cast(uint32_t, x);
    } else if constexpr (sizeof(S) == 2) {
        u[v / 2] |= (uint32_t)__builtin_bit_cast(uint16_t, x) << (16 * (v % 2));
    } else {
        u[v / 4] |= (uint32_t)__builtin_bit_cast(uint8_t, x) << (8 * (v % 4));
    }
}
// (the load hints of tilec_cuda.h; on AMD every whole-vector load is a plain global load)
template <int V, class K, LoadHint H>
TILEC_DEV void load_vec_whole(typename K::reg (&out)[V], const typename K::storage* p) {
    typedef typename K::storage S;
    constexpr int B = V * (int)sizeof(S);
    if constexpr (B < 4) {
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] = K::load(p[v]);
    } else {
        uint32_t u[B / 4];
        load_words<B>(u, p);
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] = K::load(unpack<S>(u, v));
    }
}
template <int V, class K>
TILEC_DEV void store_vec_whole(typename K::storage* p, const typename K::reg (&in)[V]) {
    typedef typename K::storage S;
    constexpr int B = V * (int)sizeof(S);
    if constexpr (B < 4) {
#pragma unroll
        for (int v = 0; v < V; ++v) p[v] = K::store(in[v]);
    } else {
        uint32_t u[B / 4] = {};
#pragma unroll
        for (int v = 0; v < V; ++v) pack<S>(u, v, K::store(in[v]));
        store_words<B>(p, u);
    }
}

// ---- dequantization of 4-bit weights, eight values per call ------------------------------------
// out[v] = H((q_v - zero) * s_v) for the eight values of the 32-bit word w (value v in bits 4v ..
// 4v + 3), each product rounded once. `bias` is tilec_cuda.h's 16-bit pair (MAGIC + zero [+ 8 for
// signed values]) in both halves: MAGIC + q - bias is q - zero exactly, which is what this
// computes (as an f32: q - zero and the 16-bit scale are exact in f32, so the product rounded to
// H is the f32 expression's conversion).
template <class H> struct Magic;
template <> struct Magic<F16> { static constexpr float value = 1024.0f; };
template <> struct Magic<BF16> { static constexpr float value = 128.0f; };
template <class H, bool SIGNED>
TILEC_DEV void dequant4x8(uint16_t (&out)[8], uint32_t w, uint32_t bias, const uint16_t (&s)[8]) {
    if (SIGNED) w ^= 0x88888888u;  // q + 8 for two's complement nibbles
    const float shift = H::load((uint16_t)bias) - Magic<H>::value;  // zero (+ 8)
#pragma unroll
    for (int v = 0; v < 8; ++v) out[v] = H::store(((float)((w >> (4 * v)) & 15u) - shift) * H::load(s[v]));
}
// V consecutive 4-bit values of row `row` from column col0 (n valid) of a packed [.., cols]
// tensor: one V/2-byte load when col0 is even and the bytes are aligned, else value by value.
template <int V, bool SIGNED>
TILEC_DEV void load_vec4(int32_t (&out)[V], const uint8_t* base, int64_t row, int64_t col0,
                         int64_t cols, int64_t n) {
    const uint8_t* p = base + row * ((cols + 1) >> 1) + (col0 >> 1);
    // (one word of up to 8 bytes: 16 values)
    typedef typename VecWord<(V / 2 > 0 ? (V / 2 < 8 ? V / 2 : 8) : 1)>::type W;
    if (V % 2 == 0 && sizeof(W) * 2 == V && n >= V && (col0 & 1) == 0 &&
        reinterpret_cast<uintptr_t>(p) % sizeof(W) == 0) {
        const uint64_t w = (uint64_t)*reinterpret_cast<const W*>(p);
#pragma unroll
        for (int v = 0; v < V; ++v) {
            const int32_t q = (int32_t)(w >> (4 * v)) & 15;
            out[v] = SIGNED ? (q ^ 8) - 8 : q;
        }
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v)
            out[v] = v < n ? (SIGNED ? load_i4(base, row, col0 + v, cols) : load_u4(base, row, col0 + v, cols)) : 0;
    }
}

// ---- LDS tile layouts: element (r, c) of a ROWS x COLS tile ----------------------------------
// Swizzled: the 16-byte chunks of row r are XOR-permuted by a function of r, so that the MFMA
// operand reads spread over the banks (tests/test_hip.py checks every gemm's accesses in a model
// of the LDS): rows read at one chunk by 8 lanes (16-byte reads of 8 consecutive rows) and by the
// 16-lane halves of 32 lanes (16-bit reads down a column of rows k and k + 8) land in different
// bank groups, and the copies' 16-byte writes of 8 consecutive chunks too. The permutation of
// row r is the XOR with (r / REP) ^ 2 (r / 8 REP), modulo the S positions (rows of 1, 2 or 4
// chunks: REP = 8, 4 or 2 rows share one; of 8 or more: REP = 1): 8 consecutive rows (8 REP) take
// S different ones, and rows 8 apart differ in bit 1 (another pair of chunks). (Not tilec_cuda.h's
// swizzle, which ldmatrix's 8-row reads shape.) Padded: each row PAD elements longer. QUADS: 4
// consecutive elements from a column that is a multiple of 4 are contiguous and 8-byte aligned
// (for 16-bit elements: one ds_read_b64 of an MFMA operand); OCTS: 8 consecutive 16-bit elements
// from a column that is a multiple of 8 are one aligned 16-byte chunk (one ds_read_b128: two
// k-steps' operands).
template <int ROWS, int COLS, typename T> struct SwizzledTile {
    static constexpr int E = 16 / (int)sizeof(T);  // elements per 16-byte chunk
    static constexpr int CPR = COLS / E;           // chunks per row
    static constexpr int S = CPR < 8 ? CPR : 8;    // positions the XOR permutes
    static constexpr int REP = 8 / S;              // consecutive rows sharing one permutation
    static constexpr int size = ROWS * COLS;
    static constexpr bool QUADS = E % 4 == 0;
    static constexpr bool OCTS = E % 8 == 0;
    static_assert(COLS % E == 0 && (CPR % 8 == 0 || CPR == 1 || CPR == 2 || CPR == 4),
                  "a swizzled row is 1, 2, 4 or a multiple of 8 chunks of 16 bytes");
    static TILEC_DEV int offset(int r, int c) {
        const int x = ((r / REP) ^ (r / (8 * REP) * 2)) % S;
        return r * COLS + (((c / E) ^ x) * E) + (c % E);
    }
};
template <int ROWS, int COLS, int PAD, typename T> struct PaddedTile {
    static constexpr int size = ROWS * (COLS + PAD);
    static constexpr int STRIDE = COLS + PAD;
    static constexpr bool QUADS = STRIDE % 4 == 0;
    static constexpr bool OCTS = STRIDE % 8 == 0 && sizeof(T) == 2;
    static TILEC_DEV int offset(int r, int c) { return r * (COLS + PAD) + c; }
};

// ---- tile copies global -> LDS ----------------------------------------------------------------
// Copy the ROWS x COLS window at `src` (row stride `ld` elements; the first nr rows and nc columns
// of it lie inside the tensor) into the LDS tile `dst` of layout L; the rest of the tile is zero.
// THREADS threads call it together; each moves whole 16-byte chunks (global_load_dwordx4 +
// ds_write_b128) in an unrolled loop: chunk c of the tile (c = tid + it * THREADS) is row
// c / CPR, columns (c % CPR) * E ... A chunk cut by the tensor's edge is gathered element by
// element, a tensor whose rows are not 16-byte aligned copied element by element. WHOLE: the
// window's column offset is a multiple of a chunk, so with aligned rows no chunk is cut.
template <int ROWS, int COLS, int THREADS, typename T> struct Chunks {
    static constexpr int E = 16 / (int)sizeof(T);  // elements per chunk
    static constexpr int CPR = COLS / E;           // chunks per row
    static constexpr int ITERS = (ROWS * CPR + THREADS - 1) / THREADS;
    static constexpr bool ROUNDS = (ROWS * CPR) % THREADS == 0;  // every thread has ITERS chunks
    static TILEC_HD bool readable(const T* src, int64_t ld) {
        return COLS % E == 0 && ld % E == 0 && (reinterpret_cast<uintptr_t>(src) % 16) == 0;
    }
    // chunk `it` of the calling thread: (row, column); false past the tile's chunks
    static TILEC_DEV bool at(int it, int& r, int& k) {
        const int c = (int)threadIdx.x + it * THREADS;
        r = c / CPR, k = (c % CPR) * E;
        return ROUNDS || c < ROWS * CPR;
    }
    // the chunk at (r, k) of the window: 16 bytes read, zeros outside the tensor
    template <bool WHOLE> static TILEC_DEV u32x4 read(const T* src, int64_t ld, int64_t nr, int64_t nc, int r, int k) {
        const T* s = src + (int64_t)r * ld + k;
        if (r >= nr || k >= nc) return u32x4{0, 0, 0, 0};
        if (WHOLE || k + E <= nc) return *reinterpret_cast<const u32x4*>(s);
        uint32_t u[4] = {};
#pragma unroll
        for (int e = 0; e < E; ++e) pack<T>(u, e, k + e < nc ? s[e] : T(0));
        return u32x4{u[0], u[1], u[2], u[3]};
    }
};
template <int ROWS, int COLS, class L, typename T>
TILEC_DEV void copy_elements(T* dst, const T* src, int64_t ld, int64_t nr, int64_t nc, int threads) {
    for (int e = threadIdx.x; e < ROWS * COLS; e += threads) {
        const int r = e / COLS, c = e % COLS;
        dst[L::offset(r, c)] = (r < nr && c < nc) ? src[(int64_t)r * ld + c] : T(0);
    }
}

// The pipeline's copies issued ahead (the Tile IR's copy_async / commit / wait), AMD's way: AMD
// has no asynchronous global -> LDS copy, so copy_issue loads the thread's chunks into registers
// (the global loads are in flight while the loop's product runs) and copy_land writes them to
// LDS at the next wait, before the barrier that publishes the stage. The destination stage is
// free from the issue on (the pipeline issues a copy only after the barrier that ends the reads
// of that stage), so landing at any time between the issue and the wait is correct; a second
// issue on the same staging registers lands the first one before. A tensor that cannot be read
// in chunks is copied element by element at the issue. The stage is kept as an offset into its
// buffer, `base` (passed again at the landing): a pointer kept in the registers would lose its
// LDS address space (flat stores instead of ds_write_b128).
template <int ROWS, int COLS, int THREADS, class L, typename T> struct Staged {
    u32x4 chunk[Chunks<ROWS, COLS, THREADS, T>::ITERS];
    int offset = 0;  // elements from the buffer's start to the stage
    bool pending = false;
};
template <int ROWS, int COLS, int THREADS, class L, typename T>
TILEC_DEV void copy_land(Staged<ROWS, COLS, THREADS, L, T>& st, T* base) {
    typedef Chunks<ROWS, COLS, THREADS, T> C;
    if (!st.pending) return;
    T* const dst = base + st.offset;
#pragma unroll
    for (int it = 0; it < C::ITERS; ++it) {
        int r, k;
        if (C::at(it, r, k)) *reinterpret_cast<u32x4*>(dst + L::offset(r, k)) = st.chunk[it];
    }
    st.pending = false;
}
template <bool WHOLE, int ROWS, int COLS, int THREADS, class L, typename T>
TILEC_DEV void copy_issue(Staged<ROWS, COLS, THREADS, L, T>& st, T* base, T* dst, const T* src,
                          int64_t ld, int64_t nr, int64_t nc) {
    typedef Chunks<ROWS, COLS, THREADS, T> C;
    copy_land(st, base);
    if (!C::readable(src, ld)) {
        copy_elements<ROWS, COLS, L>(dst, src, ld, nr, nc, THREADS);
        return;
    }
#pragma unroll
    for (int it = 0; it < C::ITERS; ++it) {
        int r, k;
        st.chunk[it] = C::at(it, r, k) ? C::template read<WHOLE>(src, ld, nr, nc, r, k) : u32x4{0, 0, 0, 0};
    }
    st.offset = (int)(dst - base);
    st.pending = true;
}
// A synchronous copy: issued and landed at once.
template <int ROWS, int COLS, int THREADS, class L, bool ASYNC, bool WHOLE, typename T>
TILEC_DEV void copy_g2s(T* dst, const T* src, int64_t ld, int64_t nr, int64_t nc) {
    static_assert(!ASYNC, "asynchronous copies go through Staged (copy_issue / copy_land)");
    Staged<ROWS, COLS, THREADS, L, T> st;
    copy_issue<WHOLE>(st, dst, dst, src, ld, nr, nc);
    copy_land(st, dst);
}

// ---- matrix units: MFMA ---------------------------------------------------------------------
// The accumulator layout of every tile GEMM (MfmaLayout in tilec/ir/layout_mfma.py). Wavefronts
// form a WARPS_M x WARPS_N grid; wave (wm, wn) owns rows wm*WM.., columns wn*WN.. of the tile as
// MI x NI MFMA tiles of T x T (T = 32: v_mfma_f32_32x32x8, k-steps of 8; T = 16:
// v_mfma_f32_16x16x16, k-steps of 16). Each product runs transposed, C^T = B^T A^T (B's fragment
// is the instruction's A operand, A's its B operand), so that a lane's accumulator registers hold
// consecutive columns of one row of C. With H = 64 / T lane groups and G = T / (4 H) register
// groups per tile, lane l holds in tile (mi, ni) row l % T and, in its registers 4g + v
// (g < G, v < 4), column 4 H g + 4 (l / T) + v: acc[(mi * NI + ni) * 4 G + 4 g + v].
// Operands: lane l holds row (A) or column (B) l % T of the k-step at k = 4 (l / T) + j, j < 4.
template <int T> struct MfmaShape;
typedef float f32x16 __attribute__((ext_vector_type(16)));
typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef _Float16 f16x4 __attribute__((ext_vector_type(4)));
typedef short i16x4 __attribute__((ext_vector_type(4)));
template <> struct MfmaShape<32> { static constexpr int KSTEP = 8, REGS = 16; typedef f32x16 acc; };
template <> struct MfmaShape<16> { static constexpr int KSTEP = 16, REGS = 4; typedef f32x4 acc; };

// d += a * b for one T x T tile; a, b: four 16-bit values each (the low one first)
template <class K, int T> TILEC_DEV void mfma(typename MfmaShape<T>::acc& d, uint64_t a, uint64_t b) {
    if constexpr (std::is_same<K, F16>::value && T == 32)
        d = __builtin_amdgcn_mfma_f32_32x32x8f16(__builtin_bit_cast(f16x4, a), __builtin_bit_cast(f16x4, b), d, 0, 0, 0);
    else if constexpr (std::is_same<K, F16>::value)
        d = __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(f16x4, a), __builtin_bit_cast(f16x4, b), d, 0, 0, 0);
    else if constexpr (T == 32)
        d = __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(__builtin_bit_cast(i16x4, a), __builtin_bit_cast(i16x4, b), d, 0, 0, 0);
    else
        d = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(i16x4, a), __builtin_bit_cast(i16x4, b), d, 0, 0, 0);
}

template <int BM, int BN, int WARPS_M, int WARPS_N, int T> struct Waves {
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N, MI = WM / T, NI = WN / T;
    static constexpr int H = WAVE / T, G = T / (4 * H);
    static_assert(WM % T == 0 && WN % T == 0 && (T == 32 || T == 16), "wave tiles of whole MFMA tiles");
    static TILEC_DEV int m0() { return (int)(threadIdx.x / WAVE) / WARPS_N * WM; }
    static TILEC_DEV int n0() { return (int)(threadIdx.x / WAVE) % WARPS_N * WN; }
};

// Four 16-bit values of a tile: (r, c .. c + 3) along a row (one 8-byte LDS read where the layout
// keeps them together) or (r .. r + 3, c) down a column.
template <class L> TILEC_DEV uint64_t quad_along(const uint16_t* t, int r, int c) {
    if constexpr (L::QUADS) {
        return *reinterpret_cast<const uint64_t*>(t + L::offset(r, c));
    } else {
        uint64_t q = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) q |= (uint64_t)t[L::offset(r, c + j)] << (16 * j);
        return q;
    }
}
template <class L> TILEC_DEV uint64_t quad_down(const uint16_t* t, int r, int c) {
    uint64_t q = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) q |= (uint64_t)t[L::offset(r + j, c)] << (16 * j);
    return q;
}

// The operand values of two k-steps of a tile's row or column `rc` (m of A, n of B) at k .. k + 7:
// ALONG, a tile whose rows are rc (K contiguous): one 16-byte read where the layout keeps the 8
// together; else a tile whose rows are k, value by value down the column. lo: k .. k + 3, hi:
// k + 4 .. k + 7.
template <bool ALONG, class L>
TILEC_DEV void operand_pair(uint64_t& lo, uint64_t& hi, const uint16_t* t, int rc, int k) {
    if constexpr (ALONG && L::OCTS) {
        const u32x4 v = *reinterpret_cast<const u32x4*>(t + L::offset(rc, k));
        lo = (uint64_t)v[0] | ((uint64_t)v[1] << 32);
        hi = (uint64_t)v[2] | ((uint64_t)v[3] << 32);
    } else if constexpr (ALONG) {
        lo = quad_along<L>(t, rc, k), hi = quad_along<L>(t, rc, k + 4);
    } else {
        lo = quad_down<L>(t, k, rc), hi = quad_down<L>(t, k + 4, rc);
    }
}

// acc += A(BM x BK) * B(BK x BN) from LDS tiles (A [BM][BK] or, TA, [BK][BM]; B [BK][BN] or, TB,
// [BN][BK]) on MFMA of T x T tiles; all threads of the wave grid call it together. The sum runs
// over K in any order, so k-steps go in pairs with K permuted within each pair of 8 H values:
// lane l's operands of the pair's two k-steps are k = 8 (l / T) + 0..3 and 8 (l / T) + 4..7
// (instead of 4 (l / T) + 0..3 of each step), the same k for A and B. An operand whose tile
// rows are m or n is then one 16-byte LDS read per pair (ds_read_b128: 8 lanes of a row-swizzled
// tile read 8 different 16-byte bank groups), not two 8-byte ones (16 lanes, 8 bank groups: a
// 2-way conflict). A K tile of an odd number of k-steps takes them one by one.
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, bool TA, bool TB, class LA, class LB,
          class K, int T>
TILEC_DEV void gemm_ss(const uint16_t* As, const uint16_t* Bs, float* acc) {
    typedef Waves<BM, BN, WARPS_M, WARPS_N, T> W;
    typedef MfmaShape<T> S;
    static_assert(BK % S::KSTEP == 0, "K tile of whole MFMA k-steps");
    const int lane = threadIdx.x % WAVE, r = lane % T;
    typename S::acc d[W::MI][W::NI];
#pragma unroll
    for (int t = 0; t < W::MI * W::NI; ++t)
#pragma unroll
        for (int i = 0; i < S::REGS; ++i) d[t / W::NI][t % W::NI][i] = acc[t * S::REGS + i];
    if constexpr (BK % (2 * S::KSTEP) == 0) {
        const int k8 = lane / T * 8;
#pragma unroll
        for (int k0 = 0; k0 < BK; k0 += 2 * S::KSTEP) {
            uint64_t a[W::MI][2], b[W::NI][2];
#pragma unroll
            for (int mi = 0; mi < W::MI; ++mi)
                operand_pair<!TA, LA>(a[mi][0], a[mi][1], As, W::m0() + mi * T + r, k0 + k8);
#pragma unroll
            for (int ni = 0; ni < W::NI; ++ni)
                operand_pair<TB, LB>(b[ni][0], b[ni][1], Bs, W::n0() + ni * T + r, k0 + k8);
#pragma unroll
            for (int s = 0; s < 2; ++s)
#pragma unroll
                for (int mi = 0; mi < W::MI; ++mi)
#pragma unroll
                    for (int ni = 0; ni < W::NI; ++ni) mfma<K, T>(d[mi][ni], b[ni][s], a[mi][s]);  // (C^T)
        }
    } else {
        const int kq = lane / T * 4;
#pragma unroll
        for (int k0 = 0; k0 < BK; k0 += S::KSTEP) {
            uint64_t a[W::MI], b[W::NI];
#pragma unroll
            for (int mi = 0; mi < W::MI; ++mi) {
                const int m = W::m0() + mi * T + r;
                a[mi] = TA ? quad_down<LA>(As, k0 + kq, m) : quad_along<LA>(As, m, k0 + kq);
            }
#pragma unroll
            for (int ni = 0; ni < W::NI; ++ni) {
                const int n = W::n0() + ni * T + r;
                b[ni] = TB ? quad_along<LB>(Bs, n, k0 + kq) : quad_down<LB>(Bs, k0 + kq, n);
            }
#pragma unroll
            for (int mi = 0; mi < W::MI; ++mi)
#pragma unroll
                for (int ni = 0; ni < W::NI; ++ni) mfma<K, T>(d[mi][ni], b[ni], a[mi]);  // (C^T)
        }
    }
#pragma unroll
    for (int t = 0; t < W::MI * W::NI; ++t)
#pragma unroll
        for (int i = 0; i < S::REGS; ++i) acc[t * S::REGS + i] = d[t / W::NI][t % W::NI][i];
}

// acc += A * B(BK x BN) with A in registers: a 16-bit fragment laid out like an accumulator of
// BM x BK on WARPS_M x 1 waves in T x T tiles (attention's P). A lane's registers 4g .. 4g + 3 of
// A's tile nk hold row l % T at columns T nk + 4 H g + 4 (l / T) + v: exactly the operand of
// k-step 4 nk G + g (its k = 4 (l / T) + v), so P feeds the second product with no data movement.
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, bool TB, class LB, class K, int T>
TILEC_DEV void gemm_rs(const uint32_t* a_frag, const uint16_t* Bs, float* acc) {
    typedef Waves<BM, BN, WARPS_M, WARPS_N, T> W;
    typedef MfmaShape<T> S;
    static_assert(WARPS_N == 1, "A in registers needs whole rows in each wave");
    static_assert(BK % T == 0, "A fragment of whole MFMA tiles");
    constexpr int NIA = BK / T;  // tiles of the A fragment per row of tiles
    const int lane = threadIdx.x % WAVE, r = lane % T, kq = lane / T * 4;
    typename S::acc d[W::MI][W::NI];
#pragma unroll
    for (int t = 0; t < W::MI * W::NI; ++t)
#pragma unroll
        for (int i = 0; i < S::REGS; ++i) d[t / W::NI][t % W::NI][i] = acc[t * S::REGS + i];
#pragma unroll
    for (int ks = 0; ks < BK / S::KSTEP; ++ks) {
        const int k0 = ks * S::KSTEP;
        uint64_t b[W::NI];
#pragma unroll
        for (int ni = 0; ni < W::NI; ++ni) {
            const int n = W::n0() + ni * T + r;
            b[ni] = TB ? quad_along<LB>(Bs, n, k0 + kq) : quad_down<LB>(Bs, k0 + kq, n);
        }
#pragma unroll
        for (int mi = 0; mi < W::MI; ++mi) {
            // registers ((mi * NIA + nk) * G + g) * 4 .. + 3: two 32-bit pairs
            const int w = ((mi * NIA + ks / W::G) * W::G + ks % W::G) * 2;
            const uint64_t a = (uint64_t)a_frag[w] | ((uint64_t)a_frag[w + 1] << 32);
#pragma unroll
            for (int ni = 0; ni < W::NI; ++ni) mfma<K, T>(d[mi][ni], b[ni], a);
        }
    }
#pragma unroll
    for (int t = 0; t < W::MI * W::NI; ++t)
#pragma unroll
        for (int i = 0; i < S::REGS; ++i) acc[t * S::REGS + i] = d[t / W::NI][t % W::NI][i];
}

// The same products on the scalar units, for dtypes the matrix units do not take (f32, f64,
// integers): each lane computes its own accumulator elements, in the same layout. Per k: B's row
// k at the lane's columns (simt_b_row), then each of its accumulator rows mi gets a * b
// (simt_fma_row).
template <class W, int T, bool TB, class LB, class KB, typename Acc>
TILEC_DEV void simt_b_row(Acc (&b)[W::NI][W::G][4], const typename KB::storage* Bs, int n0, int k) {
#pragma unroll
    for (int ni = 0; ni < W::NI; ++ni)
#pragma unroll
        for (int g = 0; g < W::G; ++g)
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                const int c = n0 + ni * T + g * 4 * W::H + v;
                b[ni][g][v] = (Acc)KB::load(Bs[TB ? LB::offset(c, k) : LB::offset(k, c)]);
            }
}
template <class W, typename Acc>
TILEC_DEV void simt_fma_row(Acc* acc, int mi, Acc a, const Acc (&b)[W::NI][W::G][4]) {
#pragma unroll
    for (int ni = 0; ni < W::NI; ++ni)
#pragma unroll
        for (int e = 0; e < 4 * W::G; ++e) {
            Acc& d = acc[(mi * W::NI + ni) * 4 * W::G + e];
            d = fma_acc(a, b[ni][e / 4][e % 4], d);
        }
}
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, bool TA, bool TB, class LA, class LB,
          class KA, class KB, typename Acc, int T>
TILEC_DEV void gemm_simt(const typename KA::storage* As, const typename KB::storage* Bs, Acc* acc) {
    typedef Waves<BM, BN, WARPS_M, WARPS_N, T> W;
    const int lane = threadIdx.x % WAVE, m0 = W::m0() + lane % T, n0 = W::n0() + lane / T * 4;
#pragma unroll 2
    for (int k = 0; k < BK; ++k) {
        Acc b[W::NI][W::G][4];
        simt_b_row<W, T, TB, LB, KB>(b, Bs, n0, k);
#pragma unroll
        for (int mi = 0; mi < W::MI; ++mi) {
            const int r = m0 + mi * T;
            simt_fma_row<W>(acc, mi, (Acc)KA::load(As[TA ? LA::offset(k, r) : LA::offset(r, k)]), b);
        }
    }
}

// acc += A * B on the scalar units with A in registers (an f32/f64 fragment laid out like an
// accumulator of BM x BK on WARPS_M x 1 waves): the H lanes l % T + T h hold a row's columns
// between them, so each A value comes from its owner by a shuffle.
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, bool TB, class LB, class KB, typename A,
          typename Acc, int T>
TILEC_DEV void gemm_simt_rs(const A* a_frag, const typename KB::storage* Bs, Acc* acc) {
    typedef Waves<BM, BN, WARPS_M, WARPS_N, T> W;
    static_assert(WARPS_N == 1, "A in registers needs whole rows in each wave");
    constexpr int NIA = BK / T;
    const int lane = threadIdx.x % WAVE, n0 = W::n0() + lane / T * 4;
#pragma unroll  // register indices must be constants
    for (int k = 0; k < BK; ++k) {
        Acc b[W::NI][W::G][4];
        simt_b_row<W, T, TB, LB, KB>(b, Bs, n0, k);
        // column k of a row: tile k / T, register group (k % T) / (4 H), lane group (k % 4H) / 4
        const int owner = lane % T + T * ((k % (4 * W::H)) / 4);
#pragma unroll
        for (int mi = 0; mi < W::MI; ++mi) {
            const A mine = a_frag[((mi * NIA + k / T) * W::G + (k % T) / (4 * W::H)) * 4 + k % 4];
            simt_fma_row<W>(acc, mi, (Acc)__shfl(mine, owner, WAVE), b);
        }
    }
}

// ---- reductions across the threads that share a row -------------------------------------------

// whether `p` holds for any lane of the 64-lane wavefront
TILEC_DEV bool warp_any(bool p) { return __any(p) != 0; }

// __shfl_xor over the whole 64-lane wavefront (ds_swizzle / DPP where the compiler can)
TILEC_DEV float shfl_xor(float v, int m) { return __shfl_xor(v, m, WAVE); }
TILEC_DEV double shfl_xor(double v, int m) { return __shfl_xor(v, m, WAVE); }
TILEC_DEV int64_t shfl_xor(int64_t v, int m) { return (int64_t)__shfl_xor((long long)v, m, WAVE); }
TILEC_DEV uint64_t shfl_xor(uint64_t v, int m) { return (uint64_t)__shfl_xor((long long)v, m, WAVE); }
template <typename T> TILEC_DEV T shfl_xor(T v, int m) { return (T)__shfl_xor((int)v, m, WAVE); }

// Butterfly over the lanes l ^ FIRST, l ^ 2 FIRST, ..., l ^ 32: every lane of a group gets the
// same value.
template <class Op, int FIRST, typename T> TILEC_DEV T wave_allreduce(T v) {
#pragma unroll
    for (int m = FIRST; m < WAVE; m *= 2) v = Op::apply(v, shfl_xor(v, m));
    return v;
}

// The row values of an MFMA accumulator of T x T tiles: each row is held by the H = 64 / T lanes
// l % T + T h of one wave (whole rows per wave).
template <class Op, int T, int N, typename V> TILEC_DEV void mfma_row_allreduce(V (&rows)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) rows[i] = wave_allreduce<Op, T>(rows[i]);
}

// One value per thread, combined over the whole block of THREADS threads; every thread gets the
// result (waves combined in a fixed order, so it is the same bits in every thread and run).
// `scratch`: THREADS / 64 values of LDS (8 bytes each), the kernel's own (its LDS is one array
// whose size tilec states); free again when this returns.
template <class Op, int THREADS, typename T> TILEC_DEV T block_allreduce(T v, unsigned char* scratch) {
    static_assert(sizeof(T) <= 8, "a reduction value of at most 8 bytes");
    v = wave_allreduce<Op, 1>(v);
    if constexpr (THREADS <= WAVE) {
        return v;
    } else {
        T* s = reinterpret_cast<T*>(scratch);
        const int wave = threadIdx.x / WAVE;
        if (threadIdx.x % WAVE == 0) s[wave] = v;
        __syncthreads();
        T r = s[0];
#pragma unroll
        for (int w = 1; w < THREADS / WAVE; ++w) r = Op::apply(r, s[w]);
        __syncthreads();  // scratch is free for the next reduction
        return r;
    }
}

// The column values of a block's vector tile (a column reduction): thread t holds VEC values of
// its columns, and the threads t % PER_ROW + k * PER_ROW (the tile's other rows) hold partials of
// the same columns. Combined so that every one of them holds the totals: lanes by shuffles, then
// waves in a fixed order (the same bits in every thread and run): a thread per value combines
// the waves' partials, and every thread reads its totals back (CUDA's block_col_allreduce does
// the same, measured there). `scratch`: THREADS / 64 * PER_ROW * VEC values of LDS (8 bytes
// each), the kernel's own; free again when this returns.
template <class Op, int THREADS, int PER_ROW, typename T, int VEC>
TILEC_DEV void block_col_allreduce(T (&v)[VEC], unsigned char* scratch) {
    static_assert(sizeof(T) <= 8, "a reduction value of at most 8 bytes");
    static_assert(PER_ROW <= WAVE && WAVE % PER_ROW == 0, "a row of the tile within one wave");
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
#pragma unroll
        for (int m = PER_ROW; m < WAVE && m < THREADS; m *= 2) v[e] = Op::apply(v[e], shfl_xor(v[e], m));
    }
    if constexpr (THREADS > WAVE) {
        T* s = reinterpret_cast<T*>(scratch);  // [THREADS / WAVE][PER_ROW * VEC]
        const int lane = threadIdx.x % WAVE, wave = threadIdx.x / WAVE;
        if (lane < PER_ROW) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) s[wave * PER_ROW * VEC + lane * VEC + e] = v[e];
        }
        __syncthreads();
        for (int i = threadIdx.x; i < PER_ROW * VEC; i += THREADS) {  // (a value per thread)
            T r = s[i];
#pragma unroll
            for (int w = 1; w < THREADS / WAVE; ++w) r = Op::apply(r, s[w * PER_ROW * VEC + i]);
            s[i] = r;
        }
        __syncthreads();
        const int c = lane % PER_ROW * VEC;
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[e] = s[c + e];
        __syncthreads();  // scratch is free for the next reduction
    }
}

// ---- host-side helpers for launchers ----------------------------------------------------------
// The plain entry point's workspace, stream-ordered (the _with_workspace entry point takes the
// caller's and allocates nothing).
inline void* workspace_alloc(size_t bytes, hipStream_t stream) {
    void* p = nullptr;
    return hipMallocAsync(&p, bytes, stream) == hipSuccess ? p : nullptr;
}
inline void workspace_free(void* p, hipStream_t stream) { (void)hipFreeAsync(p, stream); }

}  // namespace tilec

#endif  // TILEC_HIP_H
