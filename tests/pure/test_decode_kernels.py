"""The fused decode kernels (engine.backends.decode_kernels) against plain tensor code, under Triton's CPU
interpreter: the indexing, masking and epilogues a GPU runs, checked on CI's machine (GPU speed: tests/gpu)."""
import pytest
import torch
import torch.nn.functional as F

from engine.backends import decode_kernels as dk
from engine.backends.decode_kernels import Tiling

pytestmark = pytest.mark.skipif(not dk.available(), reason="needs Triton (its CPU interpreter: tests/conftest.py)")


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    err = (got.float() - want.float()).abs().max().item()
    assert err <= tol * max(1.0, want.float().abs().max().item()), err


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen2RMSNorm: normalise in fp32, round, then scale."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


@pytest.mark.parametrize("rows", [1, 3, 16, 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_matmul_bias(rows, dtype):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=g).to(dtype)
    w = (torch.randn(96, 200, generator=g) / 10).to(dtype)
    norm, bias = (1 + torch.randn(96, generator=g) / 5).to(dtype), torch.randn(200, generator=g).to(dtype)
    got = dk.matmul(x, w, norm=norm, eps=1e-6, bias=bias, tiling=Tiling(block_n=64, block_k=32))
    want = (_rms(x, norm, 1e-6).float() @ w.float() + bias.float()).to(dtype)
    _close(got, want, 1e-5 if dtype == torch.float32 else 2e-2)  # bf16: an ulp or two


@pytest.mark.parametrize("block_k", [32, 256])
def test_matmul_runs_of_k(block_k):
    g = torch.Generator().manual_seed(block_k)
    x, w = torch.randn(5, 300, generator=g), torch.randn(300, 72, generator=g) / 10
    got = dk.matmul(x, w, tiling=Tiling(block_n=32, block_k=block_k))
    _close(got, x @ w, 1e-5)


def test_matmul_swiglu_and_fp32_output():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 64, generator=g).to(torch.bfloat16)
    w = (torch.randn(64, 2 * 80, generator=g) / 8).to(torch.bfloat16)
    norm = torch.ones(64, dtype=torch.bfloat16)
    gate, up = (_rms(x, norm, 1e-6) @ w).chunk(2, dim=-1)
    _close(dk.matmul(x, w, norm=norm, eps=1e-6, swiglu=True, tiling=Tiling(block_n=32, block_k=32)),
           F.silu(gate) * up, 4e-2)
    logits = dk.matmul(x, w, out_dtype=torch.float32, tiling=Tiling(block_n=32, block_k=32))
    _close(logits, x.float() @ w.float(), 1e-5)


def _rope(x, cos, sin):
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * sin


def test_rope_store_writes_rows_at_their_positions():
    heads, kv, d, rows, length = 4, 2, 16, 3, 40
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(rows, (heads + 2 * kv) * d, generator=g)
    cos, sin = torch.randn(length, d, generator=g), torch.randn(length, d, generator=g)
    positions = torch.tensor([0, 17, 39])
    k_all = torch.zeros(2, 5, kv, length, d)  # layers, rows, kv, L, D: layer 1 of a bigger cache
    v_all = torch.zeros_like(k_all)
    q = dk.rope_store(qkv, cos, sin, positions, k_all[1], v_all[1], heads, kv, d)
    parts = qkv.view(rows, heads + 2 * kv, d)
    c, s = cos[positions][:, None], sin[positions][:, None]
    _close(q, _rope(parts[:, :heads], c, s).reshape(rows, -1), 1e-6)
    for r, p in enumerate(positions.tolist()):
        _close(k_all[1, r, :, p], _rope(parts[r, heads:heads + kv], c[r], s[r]), 1e-6)
        _close(v_all[1, r, :, p], parts[r, heads + kv:], 0)
    written = (k_all != 0).any(-1)
    assert written.sum() == rows * kv and not written[0].any() and not written[1, 3:].any()


@pytest.mark.parametrize("group", [1, 7])
def test_attend_sees_each_row_up_to_its_position(group):
    kv, d, length = 2, 16, 150
    heads = kv * group
    g = torch.Generator().manual_seed(group)
    positions = torch.tensor([0, 63, 64, 149])
    rows = positions.numel()
    q = torch.randn(rows, heads * d, generator=g)
    k_cache, v_cache = torch.randn(rows, kv, length, d, generator=g), torch.randn(rows, kv, length, d, generator=g)
    got = dk.attend(q, k_cache, v_cache, positions, kv, d, block=32)
    for r, p in enumerate(positions.tolist()):
        qr = q[r].view(heads, d)
        keys = k_cache[r].repeat_interleave(group, 0)[:, :p + 1]  # [heads, p+1, D]
        values = v_cache[r].repeat_interleave(group, 0)[:, :p + 1]
        probs = torch.softmax((keys @ qr[:, :, None]).squeeze(-1) * d ** -0.5, dim=-1)
        _close(got[r].view(heads, d), (probs[:, None] @ values).squeeze(1), 1e-5)


def test_add_matmul_takes_the_residual_add_first_and_returns_the_sum():
    """x + add, normalised, projected; the sum comes back whole however many column blocks the output has."""
    g = torch.Generator().manual_seed(11)
    x, add = torch.randn(3, 96, generator=g), torch.randn(3, 96, generator=g)
    w, norm, bias = torch.randn(96, 100, generator=g) / 10, 1 + torch.randn(96, generator=g) / 5, torch.randn(100)
    out, total = dk.add_matmul(x, add, w, norm=norm, eps=1e-6, bias=bias, tiling=Tiling(block_n=32, block_k=64))
    _close(total, x + add, 1e-6)
    _close(out, _rms(x + add, norm, 1e-6) @ w + bias, 1e-5)


def test_strided_views_are_refused_not_misread():
    """The kernels read a weight row-major or as the transpose of a row-major one; any other view (here every
    other column) would be read as garbage, so it is refused, as are strided vectors."""
    x, w = torch.randn(2, 32), torch.randn(32, 96)
    with pytest.raises(ValueError, match="contiguous"):
        dk.matmul(x, w[:, ::2])
    with pytest.raises(ValueError, match="contiguous"):
        dk.matmul(x, w.t().contiguous()[::2].t())
    cache = torch.zeros(2, 2, 8, 16)
    with pytest.raises(ValueError, match="contiguous"):
        dk.rope_store(torch.randn(2, 128), torch.ones(8, 16), torch.zeros(8, 16), torch.tensor([0, 1, 2, 3])[::2],
                      cache, cache.clone(), 4, 2, 16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_k_major_weights_give_the_same_products(dtype):
    """A weight stored [N, K] and passed as its [K, N] transpose (FusedPlan.k_major) is read through its strides:
    the same results as the row-major copy, for a plain, a SwiGLU and a split-K projection."""
    g = torch.Generator().manual_seed(21)
    x = torch.randn(3, 96, generator=g).to(dtype)
    w = (torch.randn(96, 160, generator=g) / 10).to(dtype)
    flipped = w.t().contiguous().t()
    assert flipped.stride() == (1, 96) and torch.equal(flipped, w)
    norm = torch.ones(96, dtype=dtype)
    tiling = Tiling(block_n=16, block_k=64)
    counts = torch.zeros(16, dtype=torch.int32)
    for kw in (dict(norm=norm, eps=1e-6), dict(norm=norm, eps=1e-6, swiglu=True), dict(split_k=2, counts=counts)):
        torch.testing.assert_close(dk.matmul(x, flipped, tiling=tiling, **kw), dk.matmul(x, w, tiling=tiling, **kw),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("k_major", [False, True])
def test_preloaded_weights_give_the_looped_products(k_major):
    """`preload` (FusedPlan.preload: each program's weights in one tile, read before the wait; the rows' products
    summed without tensor cores) gives what the looped kernel gives for a norm + bias, a SwiGLU with a residual
    and a split-K projection whose split is not a power of two (tiles padded and masked), at 1 to PRELOAD_ROWS
    rows, fp32 under the interpreter; more rows take the looped kernel."""
    g = torch.Generator().manual_seed(33)
    w = torch.randn(96, 160, generator=g) / 10
    w = w.t().contiguous().t() if k_major else w
    norm, bias = 1 + torch.randn(96, generator=g) / 5, torch.randn(160, generator=g)
    tiling, preload = Tiling(block_n=64, block_k=32), Tiling(block_n=16, block_k=32)
    counts = torch.zeros(16, dtype=torch.int32)
    for rows in (1, 3, dk.PRELOAD_ROWS):
        x, add = torch.randn(rows, 96, generator=g), torch.randn(rows, 96, generator=g)
        for kw in (dict(norm=norm, eps=1e-6, bias=bias), dict(norm=norm, eps=1e-6, swiglu=True),
                   dict(split_k=2, counts=counts)):
            torch.testing.assert_close(dk.matmul(x, w, tiling=tiling, preload=preload, **kw),
                                       dk.matmul(x, w, tiling=tiling, **kw), atol=1e-5, rtol=1e-5)
            assert not counts.any()
        got, total = dk.add_matmul(x, add, w, norm=norm, eps=1e-6, tiling=tiling, preload=preload)
        want, want_total = dk.add_matmul(x, add, w, norm=norm, eps=1e-6, tiling=tiling)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert torch.equal(total, want_total)
    assert dk._preload(True, 48, 3) == {"PRELOAD": True, "SPAN": 64, "ROWS": 4}  # noqa: SLF001 - padded
    assert dk.preloads(preload, w, 3) and not dk.preloads(preload, w, dk.PRELOAD_ROWS + 1)
    assert not dk.preloads(None, w, 1)


@pytest.mark.parametrize("group", [1, 7])
def test_split_attention_merges_its_chunks_into_the_same_output(group):
    """Positions cut into chunks of 32 (one program each, merged by the last to finish) give what one pass over
    them gives: rows ending inside, at and just past a chunk's edge, and at position 0. The counters it uses are
    zero again afterwards, so a second call (the next layer's) gets the same."""
    kv, d, length = 2, 16, 150
    g = torch.Generator().manual_seed(30 + group)
    positions = torch.tensor([0, 31, 32, 149])
    rows = positions.numel()
    q = torch.randn(rows, kv * group * d, generator=g)
    k_cache, v_cache = torch.randn(rows, kv, length, d, generator=g), torch.randn(rows, kv, length, d, generator=g)
    want = dk.attend(q, k_cache, v_cache, positions, kv, d, block=32)
    counts = torch.zeros(rows * kv + 3, dtype=torch.int32)
    for _ in range(2):
        got = dk.attend(q, k_cache, v_cache, positions, kv, d, block=32, chunk=32, counts=counts)
        _close(got, want, 1e-5)
        assert not counts.any()
    with pytest.raises(ValueError, match="counts"):
        dk.attend(q, k_cache, v_cache, positions, kv, d, chunk=32, counts=counts[:3])


def test_split_k_sums_its_partials_in_place():
    """K cut into runs of whole BLOCK_Ks, one program each (300 rows in runs of 32, fp32 halving the tiling's 64:
    4 splits of 3 runs); the last program of each output block sums them in split order and runs the epilogue:
    the product, in x's dtype, with the counters back at zero for the next kernel."""
    g = torch.Generator().manual_seed(9)
    x, w = torch.randn(3, 300, generator=g), torch.randn(300, 40, generator=g) / 10
    bias = torch.randn(40, generator=g)
    counts = torch.zeros(8, dtype=torch.int32)
    tiling = Tiling(block_n=16, block_k=64)
    assert dk._split(300, 4, 32) == (96, 4)  # noqa: SLF001
    for _ in range(2):
        got = dk.matmul(x, w, split_k=4, counts=counts, bias=bias, tiling=tiling)
        assert got.shape == (3, 40) and got.dtype == x.dtype and not counts.any()
        _close(got, x @ w + bias, 1e-5)
    with pytest.raises(ValueError, match="counts"):
        dk.matmul(x, w, split_k=4, counts=counts[:2], tiling=tiling)
    with pytest.raises(ValueError, match="counts"):
        dk.matmul(x, w, split_k=4, tiling=tiling)
    with pytest.raises(ValueError, match="SwiGLU"):
        dk.matmul(x, w, split_k=4, counts=counts, swiglu=True, tiling=tiling)


def test_partials_left_for_the_next_kernel_sum_to_what_the_last_program_stores():
    """matmul(reduce=False) leaves its fp32 partials [splits, M, N] and needs no counters; a preloading kernel's add
    sums them in split order and rounds them to x's dtype: bit for bit the reducing kernel's output added there,
    through the norm and the residual stream it writes. A looped kernel refuses them (its tiles of them would not
    fit in an sm90's shared memory), as it refuses malformed ones."""
    g = torch.Generator().manual_seed(10)
    x, w = torch.randn(3, 300, generator=g), torch.randn(300, 40, generator=g) / 10
    resid, norm = torch.randn(3, 40, generator=g), torch.rand(40, generator=g) + 0.5
    w2, preload = torch.randn(40, 24, generator=g), Tiling(block_n=16)
    counts = torch.zeros(8, dtype=torch.int32)
    tiling = Tiling(block_n=16, block_k=64)
    parts = dk.matmul(x, w, split_k=4, tiling=tiling, reduce=False)
    assert parts.shape == (4, 3, 40) and parts.dtype == torch.float32
    _close(parts.sum(0), x @ w, 1e-5)
    reduced = dk.matmul(x, w, split_k=4, counts=counts, tiling=tiling)
    want = dk.add_matmul(resid, reduced, w2, norm=norm, eps=1e-6, preload=preload)
    got = dk.add_matmul(resid, parts, w2, norm=norm, eps=1e-6, preload=preload)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert not torch.equal(got[1], resid)
    one = dk.matmul(x[:, :32], w[:32], split_k=4, tiling=tiling, reduce=False)  # one run of K (fp32: 32)
    assert one.shape == (3, 40)
    with pytest.raises(ValueError, match="no bias"):
        dk.matmul(x, w, split_k=4, tiling=tiling, reduce=False, bias=resid[0])
    with pytest.raises(ValueError, match="preloading"):
        dk.add_matmul(resid, parts, w2, norm=norm, eps=1e-6)
    for bad in (parts.double(), parts[:, :2]):
        with pytest.raises(ValueError, match="partials"):
            dk.add_matmul(resid, bad, w2, preload=preload)


def _rope_case(heads: int, kv: int, d: int, seed: int, length: int = 100) -> tuple:
    """Rows at a chunk's first and last positions (of 32) and the cache's: positions, their q/k/v projections,
    rotary tables, two identical random caches (keys, values) and zeroed counters."""
    g = torch.Generator().manual_seed(seed)
    positions = torch.tensor([0, 31, 32, length - 1])
    rows = positions.numel()
    qkv = torch.randn(rows, (heads + 2 * kv) * d, generator=g)
    cos, sin = torch.randn(length, d, generator=g), torch.randn(length, d, generator=g)
    caches = [tuple(torch.randn(rows, kv, length, d, generator=torch.Generator().manual_seed(seed)) for _ in range(2))
              for _ in range(2)]
    return positions, qkv, cos, sin, caches, torch.zeros(rows * kv, dtype=torch.int32)


@pytest.mark.parametrize("chunk", [0, 32])
def test_rope_attend_is_rope_store_then_attend(chunk):
    """One kernel rotating the queries and writing each row's new key and value before reading the cache: the
    same output and the same cache as `rope_store` followed by `attend` (one pass, or in chunks)."""
    heads, kv, d = 4, 2, 16
    positions, qkv, cos, sin, caches, counts = _rope_case(heads, kv, d, seed=40 + chunk)
    q = dk.rope_store(qkv, cos, sin, positions, *caches[0], heads, kv, d)
    want = dk.attend(q, *caches[0], positions, kv, d, block=32, chunk=chunk, counts=counts)
    got = dk.rope_attend(qkv, cos, sin, positions, *caches[1], heads, kv, d, chunk=chunk, counts=counts)
    _close(got, want, 1e-5)
    for a, b in zip(*caches):
        _close(b, a, 0)
    assert not counts.any()


def test_a_preloading_attention_equals_the_reading_one():
    """FusedPlan.attend_preload: each program reads its chunk of the cache before the wait, with the row's new key
    and value put in their place (the cache there holds an older step's: here noise that must not be read). The
    same output and cache as the kernel that reads after writing, for rows at a chunk's first and last position,
    in one chunk and across several; without chunks it is refused."""
    heads, kv, d, chunk = 4, 2, 16, 32
    positions, qkv, cos, sin, caches, counts = _rope_case(heads, kv, d, seed=41)
    want = dk.rope_attend(qkv, cos, sin, positions, *caches[0], heads, kv, d, chunk=chunk, counts=counts)
    got = dk.rope_attend(qkv, cos, sin, positions, *caches[1], heads, kv, d, chunk=chunk, counts=counts,
                         preload=True)
    assert torch.equal(got, want)
    for a, b in zip(*caches):
        assert torch.equal(a, b)
    assert not counts.any()
    with pytest.raises(ValueError, match="chunk"):
        dk.rope_attend(qkv, cos, sin, positions, *caches[1], heads, kv, d, preload=True)


def _step_state(rows, width, candidates, max_len=40, ring_rows=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lane_rows = ring_rows or rows
    noise = -torch.log(torch.empty(lane_rows, max_len + 1, candidates).exponential_(generator=gen))
    noise[0] = 0.0  # row 0 greedy-style: no noise
    return dk.StepState(
        temperature=torch.tensor([1.0, 0.7, 1.3, 1.0, 0.9][:rows] + [1.0] * (lane_rows - min(rows, 5))),
        top_k=torch.tensor([1, 64, 50, 5, 64][:rows] + [64] * (lane_rows - min(rows, 5))),
        top_p=torch.tensor([1.0, 1.0, 0.95, 1.0, 0.3][:rows] + [1.0] * (lane_rows - min(rows, 5))),
        noise=noise, allowed=torch.randperm(100_000, generator=gen)[:width],
        tokens=torch.zeros(lane_rows, dtype=torch.long),
        steps=torch.tensor([3, 0, max_len, 7, 12][:rows] + [1] * (lane_rows - min(rows, 5))),
        positions=torch.tensor([10, 39, 5, 20, 0][:rows] + [2] * (lane_rows - min(rows, 5))),
        ring=torch.full((8, lane_rows), -1, dtype=torch.long), launch=torch.tensor([13]), max_len=max_len)


@pytest.mark.parametrize("topk", [False, True])
@pytest.mark.parametrize("rows", [1, 5])
def test_sample_draws_what_pick_draws_and_moves_the_step_on(rows, topk):
    from engine.backends.lane_runner import CANDIDATES, pick

    width = 16 * 80  # slices of 80: padded to 128 inside
    gen = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, width, generator=gen) * 3
    logits[:, -7:] = float("-inf")  # the head's padding columns
    logits[0, 5] = logits[0, 900] = logits[0].max() + 1  # a tie for first place: the lower index wins
    state = _step_state(rows, width, CANDIDATES, ring_rows=8)
    before = {f: getattr(state, f).clone() for f in ("steps", "positions")}
    noise = state.noise[:rows].gather(1, before["steps"][:rows].view(rows, 1, 1).expand(rows, 1, CANDIDATES))
    want = pick(logits, state.temperature[:rows], state.top_k[:rows], state.top_p[:rows], noise.view(rows, -1))
    counts = torch.zeros(64, dtype=torch.int32)
    dk.sample(logits, state, CANDIDATES, counts, topk=topk)
    assert state.tokens[:rows].tolist() == state.allowed[want].tolist()
    assert state.tokens[0] == state.allowed[5]
    assert state.ring[13 % 8, :rows].tolist() == state.tokens[:rows].tolist()
    assert (state.ring[13 % 8, rows:] == -1).all() and state.launch.item() == 14
    assert state.steps[:rows].tolist() == (before["steps"][:rows] + 1).clamp_max(state.max_len).tolist()
    assert state.positions[:rows].tolist() == (before["positions"][:rows] + 1).clamp_max(state.max_len - 1).tolist()
    assert (state.tokens[rows:] == 0).all() and not counts.any()


def test_sample_refuses_widths_it_cannot_slice():
    state = _step_state(1, 16 * 80, 64)
    with pytest.raises(ValueError, match="slices"):
        dk.sample(torch.zeros(1, 1000), state, 64, torch.zeros(8, dtype=torch.int32))
    with pytest.raises(ValueError, match="counts"):
        dk.sample(torch.zeros(1, 16 * 80), state, 64, torch.zeros(1, dtype=torch.int32))


def test_fused_steps_are_the_default_for_spark_not_for_orpheus():
    """The fused kernels win where a step is made of launches (Spark's 0.5B), cuBLAS where it is made of weight
    reads (Orpheus's 3B): the lane's default follows the model's hidden size."""
    from engine.families.orpheus.synthetic import llm_config as orpheus_config
    from engine.synthetic.llm import llm_config as spark_config

    assert dk.pays_for(spark_config("full")["hidden_size"])
    assert not dk.pays_for(orpheus_config("full")["hidden_size"])
