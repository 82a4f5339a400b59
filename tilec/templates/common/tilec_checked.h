// tilec_checked.h: checked 64-bit arithmetic for the dimensions tilec's launchers compute, shared by
// the CPU and GPU device libraries (tilec_cpu.h, tilec_cuda.h). Written by tilec beside the
// generated sources; do not edit.
#pragma once

#include <cstdint>

namespace tilec {

// ---- checked dimension arithmetic (launchers only) -------------------------------------------
// Every size and `assume` a launcher computes from the dimensions goes through `ck`: 64-bit
// arithmetic where an overflow (or a division by zero) marks the result instead of wrapping.
struct ck {
    int64_t v;
    bool bad;
    ck(int64_t x) : v(x), bad(false) {}  // NOLINT: implicit from integers, on purpose
    ck(int64_t x, bool b) : v(x), bad(b) {}
};
struct ckbool {
    bool v;
    bool bad;
};
static inline ck operator+(ck a, ck b) { int64_t r; bool o = __builtin_add_overflow(a.v, b.v, &r); return ck(r, a.bad || b.bad || o); }
static inline ck operator-(ck a, ck b) { int64_t r; bool o = __builtin_sub_overflow(a.v, b.v, &r); return ck(r, a.bad || b.bad || o); }
static inline ck operator*(ck a, ck b) { int64_t r; bool o = __builtin_mul_overflow(a.v, b.v, &r); return ck(r, a.bad || b.bad || o); }
static inline ck operator/(ck a, ck b) { bool z = b.v == 0; return ck(z ? 0 : a.v / b.v, a.bad || b.bad || z); }
static inline ck operator%(ck a, ck b) { bool z = b.v == 0; return ck(z ? 0 : a.v % b.v, a.bad || b.bad || z); }
static inline ck ck_cdiv(ck a, ck b) { return (a + b - 1) / b; }
static inline ck ck_min(ck a, ck b) { return ck(a.v < b.v ? a.v : b.v, a.bad || b.bad); }
static inline ck ck_max(ck a, ck b) { return ck(a.v > b.v ? a.v : b.v, a.bad || b.bad); }
static inline ckbool operator<(ck a, ck b) { return {a.v < b.v, a.bad || b.bad}; }
static inline ckbool operator<=(ck a, ck b) { return {a.v <= b.v, a.bad || b.bad}; }
static inline ckbool operator>(ck a, ck b) { return {a.v > b.v, a.bad || b.bad}; }
static inline ckbool operator>=(ck a, ck b) { return {a.v >= b.v, a.bad || b.bad}; }
static inline ckbool operator==(ck a, ck b) { return {a.v == b.v, a.bad || b.bad}; }
static inline ckbool operator!=(ck a, ck b) { return {a.v != b.v, a.bad || b.bad}; }
static inline ckbool operator&&(ckbool a, ckbool b) { return {a.v && b.v, a.bad || b.bad}; }
static inline ckbool operator||(ckbool a, ckbool b) { return {a.v || b.v, a.bad || b.bad}; }
static inline bool overflows(ck a) { return a.bad; }
static inline bool overflows(ckbool a) { return a.bad; }

}  // namespace tilec
