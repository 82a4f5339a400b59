// Per-call cost of a small fused GEMM (relu(A @ B + bias), f32) called in a loop: what a
// framework pays for tiny layers. Built and run by bench/small_calls/run.sh.
#include "linear.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
    const int64_t n = argc > 1 ? std::atoll(argv[1]) : 16;  // M = N = K
    std::vector<float> A(n * n, 0.5f), B(n * n, 0.25f), bias(n, 0.1f), C(n * n);
    for (int w = 0; w < 200; ++w) linear(A.data(), B.data(), bias.data(), C.data(), n, n, n);
    const int calls = 5000;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
        if (linear(A.data(), B.data(), bias.data(), C.data(), n, n, n) != TILEC_OK) return 1;
    }
    const auto t1 = std::chrono::steady_clock::now();
    const double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / calls;
    const double want = 0.1 + 0.5 * 0.25 * (double)n;  // every element of C
    if (C[0] != (float)want) { std::printf("wrong result %g (want %g)\n", C[0], want); return 1; }
    std::printf("M=N=K=%lld: %.2f us per call\n", (long long)n, us);
    return 0;
}
