// A C++ program that uses tilec kernels like any C library: include the header, link the
// library, call the functions, check the status codes.
#include "ops.h"

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
    const int64_t M = 33, K = 70, N = 45;
    std::vector<float> X(M * K), W(K * N), b(N), Y(M * N), P(M * N);
    for (int64_t i = 0; i < M * K; ++i) X[i] = std::sin(0.37f * (float)i);
    for (int64_t i = 0; i < K * N; ++i) W[i] = std::cos(0.11f * (float)i) * 0.2f;
    for (int64_t j = 0; j < N; ++j) b[j] = 0.05f * (float)j - 1.0f;

    int status = linear_relu(X.data(), W.data(), b.data(), Y.data(), M, K, N);
    if (status != TILEC_OK) {
        std::printf("linear_relu: %s\n", tilec_status_string(status));
        return 1;
    }
    status = softmax_rows(Y.data(), P.data(), M, N);
    if (status != TILEC_OK) {
        std::printf("softmax_rows: %s\n", tilec_status_string(status));
        return 1;
    }

    double worst = 0.0;  // against a plain reference
    for (int64_t i = 0; i < M; ++i) {
        std::vector<double> y(N);
        double top = -1e300, sum = 0.0;
        for (int64_t j = 0; j < N; ++j) {
            double acc = b[j];
            for (int64_t k = 0; k < K; ++k) acc += (double)X[i * K + k] * W[k * N + j];
            y[j] = acc > 0.0 ? acc : 0.0;
            top = y[j] > top ? y[j] : top;
        }
        for (int64_t j = 0; j < N; ++j) sum += std::exp(y[j] - top);
        for (int64_t j = 0; j < N; ++j) {
            double want = std::exp(y[j] - top) / sum;
            worst = std::fmax(worst, std::fabs(want - P[i * N + j]));
        }
    }
    // an invalid argument is a status, not a crash
    const int bad = softmax_rows(nullptr, P.data(), M, N);
    std::printf("max error %.2e; NULL input: %s\n", worst, tilec_status_string(bad));
    const bool ok = worst < 1e-5 && bad == TILEC_ERR_NULL_POINTER;
    std::printf("%s\n", ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
