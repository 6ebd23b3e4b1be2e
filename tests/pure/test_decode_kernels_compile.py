"""The fused decode kernels compile for a Hopper GPU (sm90), on a machine without one.

Triton's CPU interpreter (test_decode_kernels.py) runs the kernels as Python, so it misses what only the compiler
rejects: a loop-carried variable changing type, grid dependency control (PDL) calls, atomics' memory semantics.
This compiles each kernel with the constants the graph lane launches it with (decode_kernels.PLAN on Spark's
0.5B shapes) through ptxas, which Triton's wheel ships, and checks it fits an H100/H200's shared memory. The
Triton installed here may pipeline differently from the GPU machine's: gate/up's looped kernel with four fp32
partials added took 185 kB here (Triton 3.9) and 281 kB on the H100's (3.6), so a kernel near the limit still needs
a GPU run.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

SHARED_MEMORY = 227 * 1024
"""Shared memory one block may use on sm90 (H100, H200)."""
HIDDEN, INTER, HEADS, KV, D, LENGTH = 896, 4864, 14, 2, 64, 1024
"""Spark's LLM (Qwen2 0.5B) and the lane's longest cache."""
ALIGNED = {"N", "K_SPLIT", "stride_wn", "stride_q", "stride_row", "stride_head", "width", "noise_row"}
"""Integer arguments that are multiples of 16 where the lane launches the kernels. As the runtime does, these and
every pointer (torch allocates them 16-byte aligned) are compiled as divisible by 16. Without that, loads are not
vectorised or pipelined as on the GPU, and shared memory comes out several times too small (gate/up: 40 kB instead
of 169 kB)."""


def _cases() -> dict[str, tuple]:
    """Each kernel as the graph lane launches it: (function name, pointer types, constants, warps, stages)."""
    from engine.backends.decode_kernels import (ATTEND_STAGES, ATTEND_WARPS, MAX_ROWS, PLAN, PRELOAD_TILINGS,
                                                SAMPLE_CHUNKS, TILINGS, _preload, _split)

    matmul = {**{n: "*bf16" for n in ("x_ptr", "add_ptr", "sum_ptr", "w_ptr", "out_ptr", "norm_ptr", "bias_ptr")}, "part_ptr": "*fp32", "count_ptr": "*i32", "eps": "fp32"}

    def projection(name: str, k: int, split: int = 1, preload: bool = False, **flags) -> tuple:
        tiling = (PRELOAD_TILINGS if preload else TILINGS)[name if split == 1 else f"{name}_split"]
        constants = dict(K=k, HAS_ADD=False, HAS_NORM=False, HAS_BIAS=False, SWIGLU=False,
                         SPLIT_K=split, UPCAST=False, PDL=PLAN.pdl, BLOCK_M=MAX_ROWS, BLOCK_N=tiling.block_n,
                         BLOCK_K=tiling.block_k, PRELOAD=False, SPAN=16, ROWS=1, REDUCE=True, ADD_PARTS=0)
        if preload:  # the tile height and rows a two-row lane launches with
            constants.update(_preload(True, _split(k, split, tiling.block_k)[0], 2))
        constants.update(flags)
        pointers = dict(matmul, out_ptr="*fp32") if name == "head" else matmul
        if flags.get("ADD_PARTS"):  # FusedPlan.late_sum: the add is the split-K kernel's fp32 partials
            pointers = dict(pointers, add_ptr="*fp32")
        return "matmul_kernel", pointers, constants, tiling.warps, tiling.stages

    attention = {**{n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "out_ptr", "cos_ptr", "sin_ptr")},
                 "pos_ptr": "*i64", "scale": "fp32",
                 "part_ptr": "*fp32", "count_ptr": "*i32"}
    heads = dict(G=HEADS // KV, BLOCK_G=16, D=D, UPCAST=False, PDL=PLAN.pdl, ROPE=PLAN.rope_in_attention)
    chunk = PLAN.attend_chunk or 256
    sample = {**{n: "*fp32" for n in ("logits_ptr", "temp_ptr", "top_p_ptr", "noise_ptr")},
              **{n: "*i64" for n in ("top_k_ptr", "allowed_ptr", "tokens_ptr", "steps_ptr", "pos_ptr", "ring_ptr",
                                     "launch_ptr", "keys_ptr")}, "count_ptr": "*i32"}
    rope = {**{n: "*bf16" for n in ("qkv_ptr", "cos_ptr", "sin_ptr", "q_ptr", "k_ptr", "v_ptr")}, "pos_ptr": "*i64"}
    return {
        "qkv": projection("qkv", HIDDEN, HAS_ADD=True, HAS_NORM=True, HAS_BIAS=True),
        "o": projection("o", HIDDEN, PLAN.o_split),
        "gate_up": projection("gate_up", HIDDEN, HAS_ADD=True, HAS_NORM=True, SWIGLU=True),
        "down": projection("down", INTER, PLAN.down_split),
        "head": projection("head", HIDDEN, HAS_ADD=True, HAS_NORM=True, HAS_BIAS=True),
        "qkv_preload": projection("qkv", HIDDEN, preload=True, HAS_ADD=True, HAS_NORM=True, HAS_BIAS=True),
        "o_preload": projection("o", HIDDEN, PLAN.o_split, preload=True),
        "gate_up_preload": projection("gate_up", HIDDEN, preload=True, HAS_ADD=True, HAS_NORM=True, SWIGLU=True),
        "down_preload": projection("down", INTER, PLAN.down_split, preload=True),
        "head_preload": projection("head", HIDDEN, preload=True, HAS_ADD=True, HAS_NORM=True, HAS_BIAS=True),
        "down_late": projection("down", INTER, PLAN.down_split, REDUCE=False),
        "qkv_parts": projection("qkv", HIDDEN, preload=True, HAS_ADD=True, HAS_NORM=True, HAS_BIAS=True,
                                ADD_PARTS=_split(INTER, PLAN.down_split, TILINGS["down_split"].block_k)[1]),
        "attend": ("attend_kernel", attention, dict(heads, BLOCK_S=256), ATTEND_WARPS, ATTEND_STAGES),
        "attend_split": ("attend_split_kernel", attention, dict(heads, CHUNK=chunk, SPLITS=-(-LENGTH // chunk),
                                                                PRELOAD=False),
                         ATTEND_WARPS, ATTEND_STAGES),
        "rope_attend": ("attend_split_kernel", attention, dict(heads, ROPE=True, CHUNK=chunk,
                                                               SPLITS=-(-LENGTH // chunk), PRELOAD=False), ATTEND_WARPS,
                        ATTEND_STAGES),
        "rope_attend_preload": ("attend_split_kernel", attention,
                                dict(heads, ROPE=True, CHUNK=chunk, SPLITS=-(-LENGTH // chunk), PRELOAD=True),
                                ATTEND_WARPS, ATTEND_STAGES),
        "rope_store": ("rope_store_kernel", rope, dict(HEADS=HEADS, KV=KV, D=D, PDL=PLAN.pdl), 1, 1),
        "sample": ("sample_kernel", sample, dict(CHUNKS=SAMPLE_CHUNKS, SLICE=1024, CANDIDATES=64, PDL=PLAN.pdl,
                                                 TOPK=False), 4, 1),
        "sample_topk": ("sample_kernel", sample, dict(CHUNKS=SAMPLE_CHUNKS, SLICE=1024, CANDIDATES=64,
                                                      PDL=PLAN.pdl, TOPK=True), 4, 1),
    }


def _compile_all() -> dict[str, object]:
    """Shared memory per kernel, or the compiler's error (run without
    TRITON_INTERPRET: see the test)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engine.backends import _decode_triton as kernels

    results: dict[str, object] = {}
    for name, (fn_name, pointers, constants, warps, stages) in _cases().items():
        fn = getattr(kernels, fn_name)
        names = fn.arg_names
        if fn_name == "matmul_kernel":  # k_major weights: a unit stride, which the runtime makes a constant
            constants = dict(constants, stride_wk=1)
        signature = {n: "constexpr" if n in constants else pointers.get(n, "i32") for n in names}
        source = ASTSource(fn=fn, signature=signature,
                           constexprs={(names.index(n),): v for n, v in constants.items()},
                           attrs={(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in ALIGNED
                                  or signature[n].startswith("*")})
        try:
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": warps, "num_stages": stages})
            results[name] = {"shared": compiled.metadata.shared}
        except Exception as err:  # noqa: BLE001 - reported, and the test fails on it
            cause = err
            while cause.__cause__ is not None:
                cause = cause.__cause__
            results[name] = f"{type(cause).__name__}: {str(cause)[-400:]}"
    return results


@pytest.fixture(scope="module")
def compiled() -> dict[str, object]:
    """The kernels compiled in a child process: the tests' conftest runs Triton as its CPU interpreter, whose
    kernels cannot be compiled."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, __file__], cwd=root, env=dict(env, PYTHONPATH=str(root)),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["qkv", "o", "gate_up", "down", "head", "qkv_preload", "o_preload",
                                  "gate_up_preload", "down_preload", "head_preload", "down_late", "qkv_parts",
                                  "attend", "attend_split",
                                  "rope_attend", "rope_attend_preload", "rope_store", "sample", "sample_topk"])
def test_kernel_compiles_for_sm90_within_its_shared_memory(compiled, name):
    found = compiled[name]
    assert isinstance(found, dict), found
    assert found["shared"] <= SHARED_MEMORY


if __name__ == "__main__":
    print(json.dumps(_compile_all()))
