"""The Triton kernels behind engine.backends.decode_kernels (imported only when that module first needs them, so
importing the engine never imports Triton).

Every kernel serves a decode step of a few rows (M <= 16 streams, one token each): the work is reading weights
once, so each kernel does one layer step's worth of it with the small elementwise work around it folded in.
`UPCAST` (set under TRITON_INTERPRET, the CPU interpreter the unit tests use) makes tl.dot take fp32 tiles: the
interpreter's bf16 dot and bf16 arithmetic are wrong (its fp32 -> bf16 conversion truncates instead of rounding
to nearest), and bf16 values are exact in fp32 so the result is the same. Every product is taken in fp32 and
rounded where the eager code rounds. Because of that truncation the CPU tests check the kernels' indexing and
masking exactly in fp32 and only roughly in bf16; bf16 rounding is checked on the GPU (tests/gpu). Every dot asks
for IEEE precision: bf16 tiles are exact either way, and an fp32 model (tests) must not be rounded to TF32.
"""
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(x_ptr, add_ptr, sum_ptr, w_ptr, out_ptr, norm_ptr, bias_ptr, res_ptr, M, N, K, stride_w, eps,
                  HAS_ADD: tl.constexpr, HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                  SWIGLU: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """out[M, N] = epilogue(rms_norm(x) @ w) for x [M, K] and w [K, N] (or [K, 2N] with SWIGLU: silu(gate) * up,
    gate in columns [0, N), up in [N, 2N)). With HAS_ADD, x is first replaced by x + add (a residual add), which
    the programs of the first column block also write to sum [M, K]. Rows are contiguous (x, add, sum: K apart;
    out, res: N apart)."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    if HAS_NORM:  # rms_norm's statistic, per row (x is a few kB: every program reads it from L2)
        sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            xk = _rows(x_ptr, add_ptr, rm, rk, m_ok[:, None] & (rk[None, :] < K), K, HAS_ADD).to(tl.float32)
            sq += tl.sum(xk * xk, axis=1)
        rstd = 1.0 / tl.sqrt(sq / K + eps)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if SWIGLU:
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        xk = _rows(x_ptr, add_ptr, rm, rk, m_ok[:, None] & k_ok[None, :], K, HAS_ADD)
        if HAS_ADD:
            if pid_n == 0:
                tl.store(sum_ptr + rm[:, None] * K + rk[None, :], xk, mask=m_ok[:, None] & k_ok[None, :])
        if HAS_NORM:  # transformers' order: normalise in fp32, round to the model dtype, then scale
            scale = tl.load(norm_ptr + rk, mask=k_ok, other=0.0)
            xn = (xk.to(tl.float32) * rstd[:, None]).to(xk.dtype).to(tl.float32)
            xk = (xn * scale.to(tl.float32)[None, :]).to(xk.dtype)
        wk = tl.load(w_ptr + rk[:, None] * stride_w + rn[None, :], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if UPCAST:
            acc += tl.dot(xk.to(tl.float32), wk.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(xk, wk, input_precision="ieee")
        if SWIGLU:
            wu = tl.load(w_ptr + rk[:, None] * stride_w + (rn + N)[None, :], mask=k_ok[:, None] & n_ok[None, :],
                         other=0.0)
            if UPCAST:
                acc_up += tl.dot(xk.to(tl.float32), wu.to(tl.float32), input_precision="ieee")
            else:
                acc_up += tl.dot(xk, wu, input_precision="ieee")
    mask = m_ok[:, None] & n_ok[None, :]
    if SWIGLU:  # the projections round to the model dtype before the activation, as the eager MLP's do
        gate = acc.to(out_ptr.dtype.element_ty).to(tl.float32)
        up = acc_up.to(out_ptr.dtype.element_ty).to(tl.float32)
        acc = gate / (1.0 + tl.exp(-gate)) * up
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_RES:
        acc += tl.load(res_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rows(x_ptr, add_ptr, rm, rk, mask, K, HAS_ADD: tl.constexpr):
    """x[rm, rk] (+ add[rm, rk], rounded to x's dtype as the eager residual add is)."""
    x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=mask, other=0.0)
    if HAS_ADD:
        extra = tl.load(add_ptr + rm[:, None] * K + rk[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + extra.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def rope_store_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_ptr, v_ptr, stride_qkv, stride_row, stride_head,
                      HEADS: tl.constexpr, KV: tl.constexpr, D: tl.constexpr):
    """One program per (row, head of q/k/v): rotates a query or key head at the row's position and writes it (the
    queries to q [M, HEADS * D], keys and values into the row's cache at that position, [rows, KV, L, D] with the
    given row and head strides). `sin` carries rotate-half's sign, as StaticQwen2's tables do."""
    row, head = tl.program_id(0), tl.program_id(1)
    pos = tl.load(pos_ptr + row)
    d = tl.arange(0, D)
    src = qkv_ptr + row * stride_qkv + head * D
    x = tl.load(src + d)
    if head < HEADS + KV:
        rolled = tl.load(src + (d + D // 2) % D)
        cos = tl.load(cos_ptr + pos * D + d)
        sin = tl.load(sin_ptr + pos * D + d)
        x = (x.to(tl.float32) * cos.to(tl.float32) + rolled.to(tl.float32) * sin.to(tl.float32)).to(x.dtype)
    if head < HEADS:
        tl.store(q_ptr + row * HEADS * D + head * D + d, x)
    elif head < HEADS + KV:
        tl.store(k_ptr + row * stride_row + (head - HEADS) * stride_head + pos * D + d, x)
    else:
        tl.store(v_ptr + row * stride_row + (head - HEADS - KV) * stride_head + pos * D + d, x)


@triton.jit
def attend_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, out_ptr, scale, stride_row, stride_head, G: tl.constexpr,
                  BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr, UPCAST: tl.constexpr):
    """One program per (row, kv head): its G query heads attend over the row's cache positions <= its position
    (online softmax in fp32, BLOCK_S positions at a time; the loop stops at the row's own length, not a bucket)."""
    row, kvh = tl.program_id(0), tl.program_id(1)
    pos = tl.load(pos_ptr + row)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, D)
    heads = kvh * G + g
    q = tl.load(q_ptr + row * (G * D) * tl.num_programs(1) + heads[:, None] * D + d[None, :], mask=g[:, None] < G,
                other=0.0)
    top = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, D], dtype=tl.float32)
    base = row * stride_row + kvh * stride_head
    for s0 in range(0, pos + 1, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        seen = s <= pos
        keys = tl.load(k_ptr + base + s[:, None] * D + d[None, :], mask=seen[:, None], other=0.0)
        if UPCAST:
            scores = tl.dot(q.to(tl.float32), tl.trans(keys.to(tl.float32)), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(keys), input_precision="ieee")
        scores = tl.where(seen[None, :], scores * scale, float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, axis=1))
        p = tl.exp(scores - new_top[:, None])
        fade = tl.exp(top - new_top)
        total = total * fade + tl.sum(p, axis=1)
        values = tl.load(v_ptr + base + s[:, None] * D + d[None, :], mask=seen[:, None], other=0.0)
        if UPCAST:
            acc = acc * fade[:, None] + tl.dot(p.to(values.dtype).to(tl.float32), values.to(tl.float32),
                                               input_precision="ieee")
        else:
            acc = acc * fade[:, None] + tl.dot(p.to(values.dtype), values, input_precision="ieee")
        top = new_top
    out = acc / total[:, None]
    tl.store(out_ptr + row * (G * D) * tl.num_programs(1) + heads[:, None] * D + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=g[:, None] < G)
