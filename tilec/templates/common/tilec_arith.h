// tilec_arith.h -- the integer and division helpers of every tilec library (tilec_cpu.h,
// tilec_gpu.h): Python's floor division and modulo, ceil division, the minimum and maximum of
// indices, powers by repeated multiplication and by squaring, the 4-bit saturation. Written by
// tilec beside the generated sources; do not edit. Plain C++17 that a host and a GPU compile
// alike: the library that includes it first defines TILEC_HD, how these functions are declared
// (`static inline` on the CPU; `__host__ __device__ __forceinline__` on the GPUs).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace tilec {

// Python floor division / modulo. For integers C++ truncates toward zero, so the quotient is
// adjusted when the remainder is nonzero and the signs differ. Integer division by zero gives 0
// (NumPy's result) instead of trapping, and MIN / -1 wraps to MIN as in NumPy. Floats follow
// CPython's float_divmod.
template <typename T> TILEC_HD T floordiv(T a, T b) {
    if constexpr (std::is_floating_point<T>::value) {
        T mod = std::fmod(a, b);
        T div = (a - mod) / b;
        if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
        if (div != 0) {
            T fd = std::floor(div);
            if (div - fd > (T)0.5) fd += 1;
            return fd;
        }
        return std::copysign((T)0, a / b);
    } else if constexpr (std::is_signed<T>::value) {
        if (b == 0) return (T)0;
        if (b == -1) return (T)(0u - (typename std::make_unsigned<T>::type)a);
        const T q = (T)(a / b);
        return (T)(q - (T)(((a % b) != 0) & ((a < 0) != (b < 0))));
    } else {
        return b == 0 ? (T)0 : (T)(a / b);
    }
}
template <typename T> TILEC_HD T floormod(T a, T b) {
    if constexpr (std::is_floating_point<T>::value) {
        T mod = std::fmod(a, b);
        if (mod != 0) {
            if ((b < 0) != (mod < 0)) mod += b;
        } else {
            mod = std::copysign((T)0, b);
        }
        return mod;
    } else if constexpr (std::is_signed<T>::value) {
        if (b == 0 || b == -1) return (T)0;
        const T r = (T)(a % b);
        return (T)((r != 0 && ((r < 0) != (b < 0))) ? r + b : r);
    } else {
        return b == 0 ? (T)0 : (T)(a % b);
    }
}

// ceil(a / b) for any signs, as the reference computes it (-(-a // b)); 0 when b is 0 (integer
// division by zero gives 0, as floordiv's)
TILEC_HD int64_t cdiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    const int64_t q = a / b, r = a % b;
    return q + ((r != 0) && ((r > 0) == (b > 0)));
}
TILEC_HD int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
TILEC_HD int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

// x ** N for a small constant N, as repeated multiplication ((x * x) * x ...), 1 / that for N < 0
// (a loop of a constant count, which the compilers unroll)
template <int N, typename T> TILEC_HD T ipow(T x) {
    if constexpr (N < 0) {
        return T(1) / ipow<-N>(x);
    } else {
        T p = x;
        for (int i = 1; i < N; ++i) p = p * x;
        return p;
    }
}

// integer x ** n (n >= 0) by squaring, wrapping around as the language's integers do: computed in
// an unsigned type (whose overflow is defined), at least 32 bits wide so that C's promotion of
// narrower ones to int cannot overflow
template <typename T> struct pow_uint { typedef uint32_t U; };
template <> struct pow_uint<int64_t> { typedef uint64_t U; };
template <> struct pow_uint<uint64_t> { typedef uint64_t U; };
template <typename T> TILEC_HD T ipow_wrap(T x, int64_t n) {
    typedef typename pow_uint<T>::U U;
    U r = 1, b = (U)x;
    for (; n > 0; n >>= 1) {
        if (n & 1) r *= b;
        b *= b;
    }
    return (T)r;
}

// a value converted to a 4-bit integer (held in an int32_t): saturated to the 4-bit range
template <bool SIGNED> TILEC_HD int32_t sat4(int32_t x) {
    return x < (SIGNED ? -8 : 0) ? (SIGNED ? -8 : 0) : x > (SIGNED ? 7 : 15) ? (SIGNED ? 7 : 15) : x;
}

}  // namespace tilec
