// The error of tilec_cpu.h's float math (exp, exp2, log, log2, log1p, sin, cos, tanh, erf, erfc
// and the activations sigmoid, silu, gelu_tanh, gelu, softplus, mish; pow at a few exponents)
// over every float (or every STRIDE-th bit pattern) against libm in double: the largest error in
// units in the last place of the float nearest the exact result where that is a normal float, in
// steps of 2^-149 where it is subnormal, and any mismatch of NaN or infinity. The bounds the comments in tilec_cpu.h state come from this check; the tests
// (tests/test_cpu_math.py) assert them on a sweep.
//   g++ -std=c++17 -O2 -march=native -fopenmp -ffp-contract=off -fno-math-errno
//       -I tilec/templates/cpu -I tilec/templates/common bench/cpu_math_ulp.cpp -o /tmp/ulp
//   /tmp/ulp [STRIDE [NAME...]]   (every float, every function: about 30 minutes on 2 cores;
//                                  -march=x86-64-v2 builds it without FMA)
#include "tilec_cpu.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

double softplus_ref(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }
double sigmoid_ref(double x) { return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x)); }

struct Fn {
    const char* name;
    double (*ref)(double);
    float (*got)(float);
};
const Fn FNS[] = {
    {"exp", [](double x) { return std::exp(x); }, tilec::exp_f32},
    {"exp2", [](double x) { return std::exp2(x); }, tilec::exp2_f32},
    {"log", [](double x) { return std::log(x); }, tilec::log_f32},
    {"log2", [](double x) { return std::log2(x); }, tilec::log2_f32},
    {"log1p", [](double x) { return std::log1p(x); }, tilec::log1p_f32},
    {"sin", [](double x) { return std::sin(x); }, tilec::sin_f32},
    {"cos", [](double x) { return std::cos(x); }, tilec::cos_f32},
    {"tanh", [](double x) { return std::tanh(x); }, tilec::tanh_f32},
    {"erf", [](double x) { return std::erf(x); }, tilec::erf_f32},
    {"erfc", [](double x) { return std::erfc(x); }, tilec::erfc_f32},
    {"pow 1/3", [](double x) { return std::pow(x, 1.0 / 3); }, [](float x) { return tilec::pow_f32(x, 1.0 / 3); }},
    {"pow -1.5", [](double x) { return std::pow(x, -1.5); }, [](float x) { return tilec::pow_f32(x, -1.5f); }},
    {"pow 2.2", [](double x) { return std::pow(x, 2.2); }, [](float x) { return tilec::pow_f32(x, 2.2); }},
    {"pow 7", [](double x) { return std::pow(x, 7.0); }, [](float x) { return tilec::pow_f32(x, 7.0f); }},
    {"pow -5", [](double x) { return std::pow(x, -5.0); }, [](float x) { return tilec::pow_f32(x, -5.0f); }},
    {"sigmoid", sigmoid_ref, tilec::sigmoid<float>},
    // (silu's bound holds where its result is above 1e-36: below, x times a subnormal sigmoid)
    {"silu", [](double x) { return x * sigmoid_ref(x); }, tilec::silu<float>},
    {"gelu_tanh", [](double x) { return x * sigmoid_ref(2 * 0.79788456080286535588 * (x + 0.044715 * x * x * x)); },
     tilec::gelu_tanh<float>},
    {"gelu", [](double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }, tilec::gelu<float>},
    {"softplus", softplus_ref, tilec::softplus<float>},
    {"mish", [](double x) { return x * std::tanh(softplus_ref(x)); }, tilec::mish<float>},
};

struct Worst {
    double err = 0;
    float x = 0;
    void take(double e, float at) {
        if (e > err) {
            err = e;
            x = at;
        }
    }
};

}  // namespace

int main(int argc, char** argv) {
    const int64_t stride = argc > 1 ? std::atoll(argv[1]) : 1;
    const int64_t n = (int64_t)(4294967296ull / (uint64_t)stride);
    const double tiny = 1.1754943508222875e-38;  // FLT_MIN
    std::printf("%-9s %28s %34s %s\n", "", "normal results: max ulp (x)", "subnormal: max steps of 2^-149 (x)",
                "NaN/inf mismatches");
    for (const Fn& f : FNS) {
        bool wanted = argc <= 2;
        for (int a = 2; a < argc; ++a) wanted |= std::strcmp(argv[a], f.name) == 0;
        if (!wanted) continue;
        Worst normal, sub;
        int64_t mismatches = 0;
        float mismatch_x = 0;
#pragma omp parallel
        {
            Worst nl, sl;
            int64_t m = 0;
            float mx = 0;
#pragma omp for schedule(static)
            for (int64_t i = 0; i < n; ++i) {
                const uint32_t u = (uint32_t)(i * stride);
                float x;
                std::memcpy(&x, &u, 4);
                const double r = f.ref((double)x);
                const float g = f.got(x), r32 = (float)r;
                if (std::isnan(r) || std::isnan(g) || std::isinf(r32) || std::isinf(g)) {
                    if (!(std::isnan(r) && std::isnan(g)) && r32 != g) {
                        ++m;
                        mx = x;
                    }
                } else if (std::fabs(r) >= tiny) {
                    int e;
                    std::frexp(std::fabs(r), &e);
                    nl.take(std::fabs((double)g - r) / std::ldexp(1.0, e - 24), x);
                } else {
                    sl.take(std::fabs((double)g - r) / std::ldexp(1.0, -149), x);
                }
            }
#pragma omp critical
            {
                normal.take(nl.err, nl.x);
                sub.take(sl.err, sl.x);
                if (m) mismatch_x = mx;
                mismatches += m;
            }
        }
        std::printf("%-9s %10.3f (%15a) %16.3f (%15a) %lld", f.name, normal.err, normal.x, sub.err, sub.x,
                    (long long)mismatches);
        if (mismatches) std::printf(", e.g. at %a", mismatch_x);
        std::printf("\n");
    }
}
