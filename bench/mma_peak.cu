// The mma.sync ceiling of the GPU it runs on: warps issuing only m16n8k16 matrix instructions
// (f16 and bf16 inputs, f32 accumulators) from registers, no memory traffic, at several warps
// per SM. tilec's CUDA target multiplies with mma.sync; its GEMM is judged against cuBLAS, which
// uses wgmma on Hopper, so this number says how much of cuBLAS's rate mma.sync can reach at all.
//   nvcc -O3 -arch=sm_90 bench/mma_peak.cu -o mma_peak && ./mma_peak
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::printf("CUDA error %s at line %d\n", cudaGetErrorString(e_), __LINE__); return 1; } } while (0)

template <bool BF16>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    if (BF16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

// each warp: ITERS steps of CHAINS independent mma (a 4 x 8 tile grid, as a 64x64 warp tile)
constexpr int CHAINS = 32;
template <bool BF16>
__global__ void peak(float* out, int iters) {
    uint32_t a[4], b[2];
    const uint32_t seed = threadIdx.x * 2654435761u;
    for (int i = 0; i < 4; ++i) a[i] = (seed >> i) & 0x3c003c00u;  // small finite 16-bit values
    for (int i = 0; i < 2; ++i) b[i] = (seed >> (i + 4)) & 0x3c003c00u;
    float d[CHAINS][4] = {};
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) mma<BF16>(d[c], a, b);
    }
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
    if (s == 12345.0f) out[threadIdx.x] = s;  // keeps the work; never true for these inputs
}

template <bool BF16>
int run(int sms, int warps_per_sm, float* out) {
    const int threads = 128, blocks = sms * (warps_per_sm / 4), iters = 4096;
    peak<BF16><<<blocks, threads>>>(out, 16);  // warm-up
    CHECK(cudaDeviceSynchronize());
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    float best = 1e30f;
    for (int rep = 0; rep < 5; ++rep) {
        CHECK(cudaEventRecord(t0));
        peak<BF16><<<blocks, threads>>>(out, iters);
        CHECK(cudaEventRecord(t1));
        CHECK(cudaEventSynchronize(t1));
        float ms = 0.0f;
        CHECK(cudaEventElapsedTime(&ms, t0, t1));
        best = ms < best ? ms : best;
    }
    int resident = 0;  // blocks one SM holds at once (registers: 128 accumulators per thread)
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, peak<BF16>, threads, 0));
    const double flops = 2.0 * 16 * 8 * 16 * CHAINS * (double)iters * blocks * (threads / 32);
    std::printf("mma.sync m16n8k16 %s->f32, %2d warps per SM launched (%2d resident): %7.1f "
                "TFLOP/s (%.3f ms)\n", BF16 ? "bf16" : "f16 ", warps_per_sm,
                resident * threads / 32 < warps_per_sm ? resident * threads / 32 : warps_per_sm,
                flops / best / 1e9, best);
    return 0;
}

int main() {
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    std::printf("%s, %d SMs\n", p.name, p.multiProcessorCount);
    float* out = nullptr;
    CHECK(cudaMalloc(&out, 1024 * sizeof(float)));
    for (int w : {4, 8, 16})
        if (run<false>(p.multiProcessorCount, w, out)) return 1;
    if (run<true>(p.multiProcessorCount, 8, out)) return 1;
    CHECK(cudaFree(out));
    return 0;
}
