// The CPU's f32 FMA rate, for bench/cpu.py's ceilings: every OpenMP thread runs independent
// chains of vector fused multiply-adds (the widest vectors the build's -march has) from
// registers, no memory. Built by bench/cpu.py with -O3 -march=native -ffp-contract=fast -fopenmp.
#include <omp.h>

#include <cstdint>

#if defined(__AVX512F__)
constexpr int LANES = 16;
#elif defined(__AVX__)
constexpr int LANES = 8;
#else
constexpr int LANES = 4;
#endif
typedef float vf __attribute__((vector_size(LANES * 4)));
// more chains than FMA latency x pipes (4 x 2), so the pipes never wait, and all of them in
// registers with the two operands: 16 + 2 of AVX-512's 32, 12 + 2 of AVX2's 16 (16 chains
// there spilled, and measured 165 against 224 GFLOP/s of tilec's own GEMM)
#if defined(__AVX512F__)
constexpr int CHAINS = 16;
#else
constexpr int CHAINS = 12;
#endif

// GFLOP/s of all threads together over about `seconds`
extern "C" double fma_peak_gflops(double seconds) {
    double flops = 0.0, elapsed = 0.0;
#pragma omp parallel reduction(+ : flops) reduction(max : elapsed)
    {
        vf acc[CHAINS], a, b;
        for (int l = 0; l < LANES; ++l) {
            a[l] = 0.999999f;
            b[l] = 1e-7f * (float)(omp_get_thread_num() + 1);
        }
        for (int c = 0; c < CHAINS; ++c) acc[c] = a * (float)(c + 1);
        const int64_t step = 1 << 16;
        int64_t iters = 0;
        const double t0 = omp_get_wtime();
        double t = t0;
        while (t - t0 < seconds) {
            for (int64_t i = 0; i < step; ++i)
                for (int c = 0; c < CHAINS; ++c) acc[c] = acc[c] * a + b;
            iters += step;
            t = omp_get_wtime();
        }
        float sink = 0.0f;
        for (int c = 0; c < CHAINS; ++c)
            for (int l = 0; l < LANES; ++l) sink += acc[c][l];
        if (sink == 12345.0f) iters = 0;  // keeps the chains; never true for these inputs
        flops = 2.0 * LANES * CHAINS * (double)iters;
        elapsed = t - t0;
    }
    return flops / elapsed / 1e9;
}
