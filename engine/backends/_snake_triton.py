"""The Triton kernel behind engine.backends.snake_fused (imported only when that module first needs it, so that
importing the decoder never imports Triton)."""
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def snake_kernel(x_ptr, alpha_ptr, out_ptr, n, channels, length, block: tl.constexpr):
    """out = x + sin²(αx)/α over a contiguous (B, C, T) tensor, α per channel, in fp32."""
    offs = tl.program_id(0) * block + tl.arange(0, block)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(alpha_ptr + (offs // length) % channels, mask=mask, other=1.0).to(tl.float32)
    s = libdevice.sin(a * x)  # the accurate sin (CUDA's sinf), not the fast approximation
    y = x + s * s * (1.0 / (a + 1e-9))
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
