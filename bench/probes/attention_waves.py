"""Probe: Is the non-causal D128 cells' gap to cuDNN the last partial wave? fp16 D128 non-causal N8192 at H = 31, 32, 33
(B1): 1984, 2048, 2112 tiles of 128 rows (15.03, 15.52, 16.0 turns of 132 SMs); forward and backward TFLOPS,
diyflash against cuDNN (SDPA), interleaved."""
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import diyflash
from bench.common import attention_flops, interleaved_tflops

for h in (31, 32, 33, 31, 32, 33):
    q, k, v = (torch.randn(1, h, 8192, 128, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    def cud():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)
    fo = diyflash.flash_attention(q, k, v)
    fc = cud()
    fwd = interleaved_tflops({"diy": lambda: diyflash.flash_attention(q, k, v), "cudnn": cud},
                             attention_flops(1, h, 8192, 8192, 128, False, "fwd"), rounds=7)
    bwd = interleaved_tflops({"diy": lambda: torch.autograd.grad(fo, (q, k, v), do, retain_graph=True),
                              "cudnn": lambda: torch.autograd.grad(fc, (q, k, v), do, retain_graph=True)},
                             attention_flops(1, h, 8192, 8192, 128, False, "bwd"), rounds=7)
    print(f"H{h} tiles {h * 64} turns {h * 64 / 132:.2f}: fwd diy {fwd['diy']:.0f} cudnn {fwd['cudnn']:.0f} "
          f"({fwd['diy'] / fwd['cudnn']:.3f}x) | bwd diy {bwd['diy']:.0f} cudnn {bwd['cudnn']:.0f} "
          f"({bwd['diy'] / bwd['cudnn']:.3f}x)", flush=True)
