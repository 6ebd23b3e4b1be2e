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
def matmul_kernel(x_ptr, add_ptr, sum_ptr, w_ptr, out_ptr, part_ptr, count_ptr, norm_ptr, bias_ptr, M, N,
                  K: tl.constexpr, K_SPLIT, stride_wk, stride_wn, eps, HAS_ADD: tl.constexpr, HAS_NORM: tl.constexpr,
                  HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr, SPLIT_K: tl.constexpr,
                  UPCAST: tl.constexpr, PDL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PRELOAD: tl.constexpr = False, SPAN: tl.constexpr = 16,
                  ROWS: tl.constexpr = 1, REDUCE: tl.constexpr = True, ADD_PARTS: tl.constexpr = 0):
    """out[M, N] = epilogue(rms_norm(x) @ w) for x [M, K] and w [K, N] (or [K, 2N] with SWIGLU: silu(gate) * up,
    gate in columns [0, N), up in [N, 2N)). With HAS_ADD, x is first replaced by x + add (a residual add), which
    the programs of the first column block also write to sum [M, K]. Rows are contiguous (x, add, sum: K apart;
    out: N apart); w is read through its strides (one of them 1: [K, N] row-major, or the transposed view
    of an [N, K] weight, whose programs then each read whole rows of K contiguous values).

    With SPLIT_K > 1 (no norm or SwiGLU), program (n, m, s) reduces rows [s * K_SPLIT, (s + 1) * K_SPLIT) of w
    into fp32 partials part [SPLIT_K, M, N] and counts itself in count[m, n]; the last of a block's programs to
    finish sums the block's partials in split order (so the result does not depend on which was last), runs the
    epilogue and sets the count back to 0 for the next kernel. Without REDUCE the programs only store their
    partials: the next kernel sums them (its ADD_PARTS), and the epilogue must be empty (no bias).

    ADD_PARTS > 0 (PRELOAD only): `add` is such partials, [ADD_PARTS, M, K] fp32, summed in split order and
    rounded to x's dtype (as a reducing split-K kernel would have stored them) before the residual add.

    PDL (programmatic dependent launch): the program may be launched while the previous kernel still runs; it
    waits for it (gdc_wait) before it reads or writes anything, so only its launch overlaps.

    PRELOAD (M <= ROWS, a few rows, one block of them): the program reads its whole slice of w (SPAN >= K_SPLIT
    rows, a power of two) in one tile *before* it waits: the weights do not depend on the previous kernel, so
    under PDL their memory latency overlaps it, and only the activations (a few kB, in L2) are read after the
    wait."""
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if PRELOAD:  # one block of ROWS rows (M <= ROWS)
        rm = tl.arange(0, ROWS)
    else:
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    k_lo = pid_k * K_SPLIT
    if PRELOAD:
        acc, acc_up = _project_preloaded(x_ptr, add_ptr, sum_ptr, w_ptr, norm_ptr, rm, m_ok, rn, n_ok, N, K, k_lo,
                                         tl.minimum(K, k_lo + K_SPLIT), stride_wk, stride_wn, eps, pid_n == 0,
                                         HAS_ADD, HAS_NORM, SWIGLU, PDL, SPAN, M * K, ADD_PARTS)
    else:
        acc, acc_up = _project(x_ptr, add_ptr, sum_ptr, w_ptr, norm_ptr, rm, m_ok, rn, n_ok, N, K, k_lo,
                               tl.minimum(K, k_lo + K_SPLIT), stride_wk, stride_wn, eps, pid_n == 0, HAS_ADD,
                               HAS_NORM, SWIGLU, UPCAST, PDL, BLOCK_M, BLOCK_N, BLOCK_K)
    mask = m_ok[:, None] & n_ok[None, :]
    at = rm[:, None] * N + rn[None, :]
    if SPLIT_K > 1:
        tl.store(part_ptr + pid_k * M * N + at, acc, mask=mask)
        if REDUCE:
            counter = count_ptr + pid_m * tl.num_programs(0) + pid_n
            if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
                total = tl.zeros_like(acc)
                for s in range(0, SPLIT_K):  # .cg: past L1, which may hold an older call's partials
                    total += tl.load(part_ptr + s * M * N + at, mask=mask, other=0.0, cache_modifier=".cg")
                _finish(total, total, out_ptr, bias_ptr, rn, at, mask, n_ok, False, HAS_BIAS)
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
    else:
        _finish(acc, acc_up, out_ptr, bias_ptr, rn, at, mask, n_ok, SWIGLU, HAS_BIAS)


@triton.jit
def _finish(acc, acc_up, out_ptr, bias_ptr, rn, at, mask, n_ok, SWIGLU: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The epilogue: SwiGLU, bias, then out[at] in out's dtype."""
    if SWIGLU:  # the projections round to the model dtype before the activation, as the eager MLP's do
        gate = acc.to(out_ptr.dtype.element_ty).to(tl.float32)
        up = acc_up.to(out_ptr.dtype.element_ty).to(tl.float32)
        acc = gate / (1.0 + tl.exp(-gate)) * up
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + at, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _project(x_ptr, add_ptr, sum_ptr, w_ptr, norm_ptr, rm, m_ok, rn, n_ok, pair, K: tl.constexpr, k_lo, k_hi,
             stride_wk, stride_wn, eps, writes_sum, HAS_ADD: tl.constexpr, HAS_NORM: tl.constexpr,
             PAIRED: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 rms_norm(x (+ add))[rm] @ w[k_lo:k_hi, rn] and, if PAIRED, @ w[k_lo:k_hi, rn + pair] too (else the
    second result is a dummy). `writes_sum`: this program also stores x + add (the residual stream) to sum."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if HAS_NORM:  # rms_norm's statistic, per row (x is a few kB: every program reads it from L2); unrolled, so
        # its loads go out together (one L2 round trip, not one per BLOCK_K: a faster step). Gathered in the main
        # loop instead, with the products scaled at the end, gate/up takes far longer
        sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in tl.static_range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            xs = _rows(x_ptr, add_ptr, rm, rk, m_ok[:, None] & (rk[None, :] < K), K, HAS_ADD).to(tl.float32)
            sq += tl.sum(xs * xs, axis=1)
        rstd = 1.0 / tl.sqrt(sq / K + eps)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < k_hi
        xk = _rows(x_ptr, add_ptr, rm, rk, m_ok[:, None] & k_ok[None, :], K, HAS_ADD)
        if HAS_ADD:
            if writes_sum:
                tl.store(sum_ptr + rm[:, None] * K + rk[None, :], xk, mask=m_ok[:, None] & k_ok[None, :])
        if HAS_NORM:  # transformers' order: normalise in fp32, round to the model dtype, then scale
            scale = tl.load(norm_ptr + rk, mask=k_ok, other=0.0)
            xn = (xk.to(tl.float32) * rstd[:, None]).to(xk.dtype).to(tl.float32)
            xk = (xn * scale.to(tl.float32)[None, :]).to(xk.dtype)
        w_mask = k_ok[:, None] & n_ok[None, :]
        w1 = tl.load(w_ptr + rk[:, None] * stride_wk + rn[None, :] * stride_wn, mask=w_mask, other=0.0)
        acc += _dot(xk, w1, UPCAST)
        if PAIRED:
            w2 = tl.load(w_ptr + rk[:, None] * stride_wk + (rn + pair)[None, :] * stride_wn, mask=w_mask, other=0.0)
            acc2 += _dot(xk, w2, UPCAST)
    return acc, acc2


@triton.jit
def _project_preloaded(x_ptr, add_ptr, sum_ptr, w_ptr, norm_ptr, rm, m_ok, rn, n_ok, pair, K: tl.constexpr, k_lo,
                       k_hi, stride_wk, stride_wn, eps, writes_sum, HAS_ADD: tl.constexpr, HAS_NORM: tl.constexpr,
                       PAIRED: tl.constexpr, PDL: tl.constexpr, SPAN: tl.constexpr, part_stride,
                       ADD_PARTS: tl.constexpr):
    """`_project` for a few rows rm (ROWS of them, no tensor-core tile of 16 to fill), with the program's weights
    w[k_lo:k_hi, rn] (and rn + pair) read before the wait for the previous kernel as one [SPAN, BLOCK_N] tile
    each; then x's rows [ROWS, SPAN, 1] and their products with the tile, summed over K in fp32 in one reduction
    for all rows. With a norm the program holds all of K, so the statistic comes from the same values.
    (Loaded in two dimensions, then broadcast: a slightly faster lane step than a three-dimensional load. The
    products on tensor cores, x's rows in one [16, SPAN] tile, are slower for gate/up.)"""
    rk = k_lo + tl.arange(0, SPAN)
    k_ok = rk < k_hi
    w_at = rk[:, None] * stride_wk + rn[None, :] * stride_wn
    w_mask = k_ok[:, None] & n_ok[None, :]
    w1 = tl.load(w_ptr + w_at, mask=w_mask, other=0.0)[None, :, :]
    w2 = w1
    if PAIRED:
        w2 = tl.load(w_ptr + w_at + pair * stride_wn, mask=w_mask, other=0.0)[None, :, :]
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    x_at = rm[:, None, None] * K + rk[None, :, None]
    x_mask = m_ok[:, None, None] & k_ok[None, :, None]
    xk = tl.load(x_ptr + x_at, mask=x_mask, other=0.0)
    if HAS_ADD:
        xk = (xk.to(tl.float32) + _addend(add_ptr, x_at, x_mask, part_stride, ADD_PARTS, xk.dtype)).to(xk.dtype)
        if writes_sum:
            tl.store(sum_ptr + x_at, xk, mask=x_mask)
    if HAS_NORM:  # transformers' order: normalise in fp32, round to the model dtype, then scale
        xs = xk.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xs * xs, axis=1, keep_dims=True) / K + eps)
        scale = tl.load(norm_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)[None, :, None]
        xk = ((xs * rstd).to(xk.dtype).to(tl.float32) * scale).to(xk.dtype)
    xf = xk.to(tl.float32)
    acc = tl.sum(xf * w1.to(tl.float32), axis=1)
    acc2 = acc
    if PAIRED:
        acc2 = tl.sum(xf * w2.to(tl.float32), axis=1)
    return acc, acc2


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr):
    """a @ b in fp32 (IEEE: an fp32 model is not rounded to TF32)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _rows(x_ptr, add_ptr, rm, rk, mask, K, HAS_ADD: tl.constexpr):
    """x[rm, rk] (+ add[rm, rk], rounded to x's dtype as the eager residual add is)."""
    at = rm[:, None] * K + rk[None, :]
    x = tl.load(x_ptr + at, mask=mask, other=0.0)
    if HAS_ADD:
        x = (x.to(tl.float32) + _addend(add_ptr, at, mask, 0, 0, x.dtype)).to(x.dtype)
    return x


@triton.jit
def _addend(add_ptr, at, mask, part_stride, ADD_PARTS: tl.constexpr, dtype: tl.constexpr):
    """add[at] in fp32: a tensor of x's dtype, or (ADD_PARTS > 0) the sum of that many fp32 split-K partials
    part_stride apart, in split order from zero and rounded to `dtype`: what a reducing split-K kernel stores."""
    if ADD_PARTS == 0:
        return tl.load(add_ptr + at, mask=mask, other=0.0).to(tl.float32)
    total = tl.zeros(at.shape, dtype=tl.float32)
    for s in tl.static_range(ADD_PARTS):
        # .cg: past L1, as the reducing kernel reads its partials
        total += tl.load(add_ptr + s * part_stride + at, mask=mask, other=0.0, cache_modifier=".cg")
    return total.to(dtype).to(tl.float32)


@triton.jit
def rope_store_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_ptr, v_ptr, stride_qkv, stride_row, stride_head,
                      HEADS: tl.constexpr, KV: tl.constexpr, D: tl.constexpr, PDL: tl.constexpr):
    """One program per (row, head of q/k/v): rotates a query or key head at the row's position and writes it (the
    queries to q [M, HEADS * D], keys and values into the row's cache at that position, [rows, KV, L, D] with the
    given row and head strides). `sin` carries rotate-half's sign, as StaticQwen2's tables do."""
    row, head = tl.program_id(0), tl.program_id(1)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
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
def attend_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, out_ptr, cos_ptr, sin_ptr, scale, stride_q, stride_row, stride_head,
                  G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr,
                  ROPE: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    """One program per (row, kv head): its G query heads attend over the row's cache positions <= its position
    (online softmax in fp32, BLOCK_S positions at a time; the loop stops at the row's own length, not a bucket).
    Rows of q are stride_q apart. With ROPE, q_ptr is the q/k/v projection itself: the program rotates its
    queries, and its key (rotated) and value go into the cache at the row's position first (rope_store_kernel's
    work, one kernel fewer a layer)."""
    row, kvh = tl.program_id(0), tl.program_id(1)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pos = tl.load(pos_ptr + row)
    base = row * stride_row + kvh * stride_head
    q, at, live = _queries(q_ptr, cos_ptr, sin_ptr, stride_q, row, kvh, pos, G, BLOCK_G, D, ROPE)
    if ROPE:
        _store_new_kv(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, stride_q, row, kvh, pos, base, G, D)
    top, total, acc = _attend_span(q, k_ptr, v_ptr, base, 0, pos + 1, scale, D, BLOCK_S, UPCAST)
    tl.store(out_ptr + at, (acc / total[:, None]).to(out_ptr.dtype.element_ty), mask=live)


@triton.jit
def attend_split_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, out_ptr, cos_ptr, sin_ptr, part_ptr, count_ptr, scale, stride_q,
                        stride_row, stride_head, G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr,
                        CHUNK: tl.constexpr, SPLITS: tl.constexpr, ROPE: tl.constexpr, UPCAST: tl.constexpr,
                        PDL: tl.constexpr, PRELOAD: tl.constexpr = False):
    """`attend_kernel` with a row's positions cut into chunks of CHUNK, one program each (flash-decoding): a long
    row is read by many SMs at once instead of one. Each program leaves its softmax state (running max, total,
    weighted values) in part [rows, kv, SPLITS, BLOCK_G, D + 2] and counts itself in count[row, kv]; the last of
    a (row, kv head)'s programs to finish merges them in chunk order (so the result does not depend on which was
    last) and sets its count back to 0 for the next call. Programs past the row's length return at once. With
    ROPE, the program of the chunk holding the row's position writes its new key and value (`attend_kernel`).

    PRELOAD (with ROPE): the program reads its chunk's keys and values *before* it waits for the q/k/v projection
    (the row's position and the cache before it come from earlier steps), in one tile each, so that their memory
    latency overlaps the previous kernel; the new key and value take the position's place in the tiles."""
    row, kvh, chunk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    base = row * stride_row + kvh * stride_head
    if PRELOAD:
        pos = tl.load(pos_ptr + row)
        s = chunk * CHUNK + tl.arange(0, CHUNK)
        d = tl.arange(0, D)
        old = (s < pos)[:, None]
        keys = tl.load(k_ptr + base + s[:, None] * D + d[None, :], mask=old, other=0.0)
        values = tl.load(v_ptr + base + s[:, None] * D + d[None, :], mask=old, other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if not PRELOAD:
        pos = tl.load(pos_ptr + row)
    chunks = pos // CHUNK + 1
    if chunk < chunks:
        q, at, live = _queries(q_ptr, cos_ptr, sin_ptr, stride_q, row, kvh, pos, G, BLOCK_G, D, ROPE)
        if PRELOAD:
            key, value = _new_kv(q_ptr, cos_ptr, sin_ptr, stride_q, row, kvh, pos, G, D)
            if chunk == chunks - 1:
                _store_kv(k_ptr, v_ptr, base, pos, key, value, D)
            new = (s == pos)[:, None]
            keys = tl.where(new, key[None, :], keys)
            values = tl.where(new, value[None, :], values)
            top, total, acc = _attend_block(q, keys, values, s <= pos, scale, *_softmax_start(BLOCK_G, D), UPCAST)
        else:
            if ROPE:
                if chunk == chunks - 1:
                    _store_new_kv(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, stride_q, row, kvh, pos, base, G, D)
            lo = chunk * CHUNK
            top, total, acc = _attend_span(q, k_ptr, v_ptr, base, lo, tl.minimum(lo + CHUNK, pos + 1), scale, D,
                                           CHUNK, UPCAST)
        if chunks == 1:  # a row shorter than a chunk: attend_kernel's work, nothing to merge
            tl.store(out_ptr + at, (acc / total[:, None]).to(out_ptr.dtype.element_ty), mask=live)
        else:
            _leave_or_merge(part_ptr, count_ptr, out_ptr, at, live, top, total, acc, row, kvh, chunk, chunks,
                            BLOCK_G, D, SPLITS)


@triton.jit
def _leave_or_merge(part_ptr, count_ptr, out_ptr, at, live, top, total, acc, row, kvh, chunk, chunks,
                    BLOCK_G: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr):
    """`attend_split_kernel`'s hand-over: this chunk's softmax state into part, then, in the last chunk to finish,
    the merge of all of the row's chunks in chunk order into out."""
    g, d = tl.arange(0, BLOCK_G), tl.arange(0, D)
    slot = part_ptr + ((row * tl.num_programs(1) + kvh) * SPLITS) * BLOCK_G * (D + 2)
    mine = slot + chunk * BLOCK_G * (D + 2) + g * (D + 2)
    tl.store(mine[:, None] + d[None, :], acc)
    tl.store(mine + D, top)
    tl.store(mine + D + 1, total)
    counter = count_ptr + row * tl.num_programs(1) + kvh
    if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == chunks - 1:  # the last one: merge
        top = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
        total = tl.zeros([BLOCK_G], dtype=tl.float32)
        acc = tl.zeros([BLOCK_G, D], dtype=tl.float32)
        for c in range(0, chunks):  # .cg: past L1, which may hold an older call's states
            theirs = slot + c * BLOCK_G * (D + 2) + g * (D + 2)
            their_top = tl.load(theirs + D, cache_modifier=".cg")
            new_top = tl.maximum(top, their_top)
            fade, their_fade = tl.exp(top - new_top), tl.exp(their_top - new_top)
            total = total * fade + tl.load(theirs + D + 1, cache_modifier=".cg") * their_fade
            values = tl.load(theirs[:, None] + d[None, :], cache_modifier=".cg")
            acc = acc * fade[:, None] + values * their_fade[:, None]
            top = new_top
        tl.store(out_ptr + at, (acc / total[:, None]).to(out_ptr.dtype.element_ty), mask=live)
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


@triton.jit
def _queries(q_ptr, cos_ptr, sin_ptr, stride_q, row, kvh, pos, G: tl.constexpr, BLOCK_G: tl.constexpr,
             D: tl.constexpr, ROPE: tl.constexpr):
    """The G query heads of kv head `kvh` in row `row` of q (rows stride_q apart; padded to BLOCK_G with zeros),
    rotated at `pos` with ROPE; their offsets in the output [rows, kv * G * D], and which of the BLOCK_G are real."""
    g, d = tl.arange(0, BLOCK_G), tl.arange(0, D)
    heads = (kvh * G + g)[:, None] * D
    live = g[:, None] < G
    q = tl.load(q_ptr + row * stride_q + heads + d[None, :], mask=live, other=0.0)
    if ROPE:
        rolled = tl.load(q_ptr + row * stride_q + heads + ((d + D // 2) % D)[None, :], mask=live, other=0.0)
        q = _rotate(q, rolled, cos_ptr, sin_ptr, pos, D)
    return q, row * (G * D) * tl.num_programs(1) + heads + d[None, :], live


@triton.jit
def _rotate(x, rolled, cos_ptr, sin_ptr, pos, D: tl.constexpr):
    """x * cos + rolled * sin at `pos` (sin carries rotate-half's sign), in fp32, rounded to x's dtype: as
    rope_store_kernel does."""
    d = tl.arange(0, D)
    cos = tl.load(cos_ptr + pos * D + d).to(tl.float32)
    sin = tl.load(sin_ptr + pos * D + d).to(tl.float32)
    return (x.to(tl.float32) * cos + rolled.to(tl.float32) * sin).to(x.dtype)


@triton.jit
def _store_new_kv(qkv_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, stride_q, row, kvh, pos, base, G: tl.constexpr,
                  D: tl.constexpr):
    """The row's new key (rotated) and value for kv head `kvh`, from its q/k/v projection into the cache at `pos`;
    then a barrier, so the program's own loads of the cache see them."""
    key, value = _new_kv(qkv_ptr, cos_ptr, sin_ptr, stride_q, row, kvh, pos, G, D)
    _store_kv(k_ptr, v_ptr, base, pos, key, value, D)
    tl.debug_barrier()


@triton.jit
def _new_kv(qkv_ptr, cos_ptr, sin_ptr, stride_q, row, kvh, pos, G: tl.constexpr, D: tl.constexpr):
    """The row's new key (rotated at `pos`) and value [D] for kv head `kvh`, from its q/k/v projection."""
    d = tl.arange(0, D)
    heads = G * tl.num_programs(1)
    src = qkv_ptr + row * stride_q
    key = _rotate(tl.load(src + (heads + kvh) * D + d), tl.load(src + (heads + kvh) * D + (d + D // 2) % D),
                  cos_ptr, sin_ptr, pos, D)
    return key, tl.load(src + (heads + tl.num_programs(1) + kvh) * D + d)


@triton.jit
def _store_kv(k_ptr, v_ptr, base, pos, key, value, D: tl.constexpr):
    """A key and a value [D] into the cache at `pos`."""
    d = tl.arange(0, D)
    tl.store(k_ptr + base + pos * D + d, key)
    tl.store(v_ptr + base + pos * D + d, value)


@triton.jit
def _attend_span(q, k_ptr, v_ptr, base, lo, hi, scale, D: tl.constexpr, BLOCK_S: tl.constexpr, UPCAST: tl.constexpr):
    """Online softmax of q [BLOCK_G, D] over cache positions [lo, hi) (keys and values at base + position * D):
    the running max, the total of exp(score - max) and the exp-weighted values [BLOCK_G, D], all fp32."""
    d = tl.arange(0, D)
    top, total, acc = _softmax_start(q.shape[0], D)
    for s0 in range(lo, hi, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        seen = s < hi
        keys = tl.load(k_ptr + base + s[:, None] * D + d[None, :], mask=seen[:, None], other=0.0)
        values = tl.load(v_ptr + base + s[:, None] * D + d[None, :], mask=seen[:, None], other=0.0)
        top, total, acc = _attend_block(q, keys, values, seen, scale, top, total, acc, UPCAST)
    return top, total, acc


@triton.jit
def _softmax_start(G: tl.constexpr, D: tl.constexpr):
    """An empty online softmax state for G query heads: running max -inf, total 0, weighted values [G, D] 0."""
    return (tl.full([G], float("-inf"), dtype=tl.float32), tl.zeros([G], dtype=tl.float32),
            tl.zeros([G, D], dtype=tl.float32))


@triton.jit
def _attend_block(q, keys, values, seen, scale, top, total, acc, UPCAST: tl.constexpr):
    """One block of positions (keys and values [S, D], `seen` [S] the real ones) into the online softmax state.
    The weights are rounded to the values' dtype before their product, as the eager attention's probabilities
    are."""
    scores = tl.where(seen[None, :], _dot(q, tl.trans(keys), UPCAST) * scale, float("-inf"))
    new_top = tl.maximum(top, tl.max(scores, axis=1))
    p = tl.exp(scores - new_top[:, None])
    fade = tl.exp(top - new_top)
    total = total * fade + tl.sum(p, axis=1)
    acc = acc * fade[:, None] + _dot(p.to(values.dtype), values, UPCAST)
    return new_top, total, acc


@triton.jit
def sample_kernel(logits_ptr, temp_ptr, top_k_ptr, top_p_ptr, noise_ptr, allowed_ptr, tokens_ptr, steps_ptr,
                  pos_ptr, ring_ptr, launch_ptr, keys_ptr, count_ptr, width, noise_row, noise_step, max_len, ring,
                  ring_stride, CHUNKS: tl.constexpr, SLICE: tl.constexpr, CANDIDATES: tl.constexpr, PDL: tl.constexpr,
                  TOPK: tl.constexpr):
    """A decode step's sampling in one kernel (lane_runner.pick's draw, then the step's bookkeeping). Program
    (c, row) sorts slice c of the row's fp32 logits [rows, width] (SLICE >= width / CHUNKS) and keeps its top
    CANDIDATES in keys [rows, CHUNKS, CANDIDATES]; the last of the row's programs to finish (count[row]) sorts
    their union, so it holds the row's top CANDIDATES largest first (lane_runner.top_candidates), and draws by
    Gumbel-max: argmax(value / temperature + noise[row, step]) over the ranks that top-k and top-p keep. It writes
    allowed[pick] as the row's next token, into ring[launch % ring, row] too, moves the row's step and position
    on (clamped to the buffers) and sets its count back to 0; the last row to finish (count[rows], rows being the
    grid's) moves the launch counter on.

    A logit and its index travel as one int64 key, so one sort orders both: the float's bits made order-preserving
    as an int32 (negative floats' magnitude bits flipped) above, 2^31 - 1 - index below (equal logits: the
    lower index first). TOPK: each selection is Triton's bitonic top-k (sorted runs of CANDIDATES keys, then
    halving merges) instead of a full sort; same keys out, since no two keys are equal."""
    c, row = tl.program_id(0), tl.program_id(1)
    if PDL:
        tl.extra.cuda.gdc_wait()
    at = tl.arange(0, SLICE)
    index = c * (width // CHUNKS) + at
    live = (at < width // CHUNKS) & (index < width)
    values = tl.load(logits_ptr + row * width + index, mask=live, other=float("-inf"))
    best = _top(_keys(values, index), SLICE, CANDIDATES, TOPK)
    rank = tl.arange(0, CANDIDATES)
    tl.store(keys_ptr + (row * CHUNKS + c) * CANDIDATES + rank, best)
    if tl.atomic_add(count_ptr + row, 1, sem="acq_rel", scope="gpu") == CHUNKS - 1:
        _draw(temp_ptr, top_k_ptr, top_p_ptr, noise_ptr, allowed_ptr, tokens_ptr, steps_ptr, pos_ptr, ring_ptr,
              launch_ptr, keys_ptr, count_ptr, row, noise_row, noise_step, max_len, ring, ring_stride, CHUNKS,
              CANDIDATES, TOPK)


@triton.jit
def _draw(temp_ptr, top_k_ptr, top_p_ptr, noise_ptr, allowed_ptr, tokens_ptr, steps_ptr, pos_ptr, ring_ptr,
          launch_ptr, keys_ptr, count_ptr, row, noise_row, noise_step, max_len, ring, ring_stride,
          CHUNKS: tl.constexpr, CANDIDATES: tl.constexpr, TOPK: tl.constexpr):
    """`sample_kernel`'s last program of a row: the draw among the row's top candidates and the bookkeeping."""
    union = tl.arange(0, CHUNKS * CANDIDATES)
    keys = tl.load(keys_ptr + row * CHUNKS * CANDIDATES + union, cache_modifier=".cg")  # .cg: past L1
    best = _top(keys, CHUNKS * CANDIDATES, CANDIDATES, TOPK)
    ordered = (best >> 32).to(tl.int32)
    values = (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    index = 0x7FFFFFFF - (best & 0x7FFFFFFF)
    rank = tl.arange(0, CANDIDATES)
    values = values / tl.load(temp_ptr + row)
    values = tl.where(rank < tl.load(top_k_ptr + row), values, float("-inf"))
    probs = tl.exp(values - tl.max(values, axis=0))
    probs = probs / tl.sum(probs, axis=0)
    before = tl.cumsum(probs, axis=0) - probs
    values = tl.where(before < tl.load(top_p_ptr + row), values, float("-inf"))
    step = tl.load(steps_ptr + row)
    noise = tl.load(noise_ptr + row * noise_row + step * noise_step + rank)
    chosen = tl.argmax(values + noise, axis=0)
    token = tl.load(allowed_ptr + tl.sum(tl.where(rank == chosen, index, 0), axis=0))
    tl.store(tokens_ptr + row, token)
    tl.store(steps_ptr + row, tl.minimum(step + 1, max_len))
    tl.store(pos_ptr + row, tl.minimum(tl.load(pos_ptr + row) + 1, max_len - 1))
    launch = tl.load(launch_ptr)
    tl.store(ring_ptr + (launch % ring) * ring_stride + row, token)
    tl.atomic_xchg(count_ptr + row, 0, sem="relaxed", scope="gpu")
    rows = tl.num_programs(1)
    if tl.atomic_add(count_ptr + rows, 1, sem="acq_rel", scope="gpu") == rows - 1:
        tl.store(launch_ptr, launch + 1)
        tl.atomic_xchg(count_ptr + rows, 0, sem="relaxed", scope="gpu")


@triton.jit
def _keys(values, index):
    """int64 sort keys of fp32 values and their int32 indices (sample_kernel)."""
    bits = values.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - index).to(tl.int64)


@triton.jit
def _top(keys, N: tl.constexpr, K: tl.constexpr, TOPK: tl.constexpr):
    """The K largest of N keys, largest first: Triton's top-k (TOPK), else a sort and its first row of K."""
    if TOPK:
        return tl.topk(keys, K)
    ranked = tl.reshape(tl.sort(keys, descending=True), [N // K, K])
    first = tl.arange(0, N // K)[:, None] == 0
    return tl.sum(tl.where(first, ranked, 0), axis=0)
