"""Which kernels the peers launch (cuBLAS through torch.mm, cuBLASLt's bias+ReLU, SDPA's
backends), by name, for the shapes bench/gpu.py times: the tile shape, schedule (cooperative or
ping-pong, stream-K) and cluster that a peer's kernel name states, for comparing tilec's choices
with. Run on the device: `python3 bench/peer_kernels.py`."""
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile


def kernels(fn, *args, **kw) -> list:
    """The names of the CUDA kernels one call of `fn(*args, **kw)` launches (after a warm-up
    call)."""
    fn(*args, **kw)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args, **kw)
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for dt in (torch.float16, torch.bfloat16):
        for n in (2048, 4000, 4096, 8192):
            a, b = (torch.randn(n, n, device="cuda", dtype=dt) for _ in range(2))
            print(f"torch.mm {dt} {n}^3:", kernels(torch.mm, a, b))
    a, b = (torch.randn(4096, 4096, device="cuda", dtype=torch.float16) for _ in range(2))
    bias = torch.randn(4096, device="cuda", dtype=torch.float16)
    print("addmm 4096^3:", kernels(torch.addmm, bias, a, b))
    print("_addmm_activation relu 4096^3:",
          kernels(torch._addmm_activation, bias, a, b, use_gelu=False))
    q, k, v = (torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        with sdpa_kernel(backend):
            print(f"SDPA {backend.name} D128:",
                  kernels(F.scaled_dot_product_attention, q, k, v))


if __name__ == "__main__":
    main()
