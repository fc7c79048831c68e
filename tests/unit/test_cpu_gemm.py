"""A float32 judge's linear layers on prepacked oneDNN weights: the same numbers as torch's linear, and oneDNN's
per-shape caches capped, so a long run's passes (every token count from 1 up) do not grow the C heap."""

import ctypes
import json
import os
import subprocess
import sys

import pytest
import torch

from offline_sumscore.engine.cpu import cpu_gemm

needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"),
    reason="this torch build has no oneDNN",
)

# Run in a fresh process: oneDNN reads its cache sizes once, when it first builds a primitive. Prints the C heap's
# growth (glibc's mallinfo2) over 300 calls, each with another row count.
HEAP_GROWTH = """
import ctypes, json, torch
from offline_sumscore.engine.cpu.cpu_gemm import pack_linears

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks".split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
torch.manual_seed(0)
layers = torch.nn.Sequential(torch.nn.Linear(576, 1536), torch.nn.Linear(1536, 576))
pack_linears(layers)
with torch.no_grad():
    for rows in range(1, 101):
        layers(torch.randn(rows, 576))
    before = libc.mallinfo2().uordblks
    for rows in range(101, 401):
        layers(torch.randn(rows, 576))
print(json.dumps({"growth_mib": (libc.mallinfo2().uordblks - before) / 2**20}))
"""


def heap_growth_mib(**env) -> float:
    clean = {k: v for k, v in os.environ.items() if k not in cpu_gemm.CACHE_VARIABLES}
    clean.update(env, OFFLINE_SUMSCORE_CPU_GEMM="onednn")
    done = subprocess.run([sys.executable, "-c", HEAP_GROWTH], env=clean, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["growth_mib"]


def glibc_has_mallinfo2() -> bool:
    return sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "mallinfo2")


@needs_onednn
def test_packed_linear_gives_torchs_numbers(monkeypatch):
    monkeypatch.delenv("OFFLINE_SUMSCORE_CPU_GEMM", raising=False)
    torch.manual_seed(0)
    layer = torch.nn.Linear(576, 192)
    x = torch.randn(37, 576)
    with torch.no_grad():
        expected = layer(x)
        said = cpu_gemm.pack_linears(layer)
        got = layer(x)
    assert said.startswith("oneDNN on prepacked weights (1 linear layers")
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-5)


@needs_onednn
@pytest.mark.skipif(not glibc_has_mallinfo2(), reason="reads glibc's heap (mallinfo2)")
def test_many_row_counts_do_not_grow_the_heap():
    # 300 shapes x 2 layers under oneDNN's default caches (1,024 entries each) hold about 0.5 MB a shape: over 100 MiB.
    # Capped at PRIMITIVE_CACHE entries, what they hold stays within a few MiB.
    assert heap_growth_mib() < 32
    # The user's environment wins: with the default sizes set by hand, the caches grow as they did before the cap.
    assert heap_growth_mib(ONEDNN_PRIMITIVE_CACHE_CAPACITY="1024", LRU_CACHE_CAPACITY="1024") > 64


@needs_onednn
def test_a_packed_weight_is_released_and_a_tied_one_kept(monkeypatch):
    monkeypatch.delenv("OFFLINE_SUMSCORE_CPU_GEMM", raising=False)
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"embed": torch.nn.Embedding(50, 64), "proj": torch.nn.Linear(64, 64)})
    model["head"] = torch.nn.Linear(64, 50, bias=False)
    model["head"].weight = model["embed"].weight  # tied, as a small judge's head is its embedding table
    x = torch.randn(5, 64)
    with torch.no_grad():
        expected = model["head"](model["proj"](x))
        said = cpu_gemm.pack_linears(model)
        got = model["head"](model["proj"](x))
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-5)
    assert model["proj"].weight is None and (model["proj"].in_features, model["proj"].out_features) == (64, 64)
    assert model["head"].weight is model["embed"].weight and model["embed"].weight.device.type == "cpu"
    assert "dense copies released, 0 MiB" in said  # 16 KiB: the projection's only
    with pytest.raises(TypeError):  # what is gone is gone loudly, never read as zeros
        torch.nn.functional.linear(x, model["proj"].weight)
    assert "(1 linear layers" in cpu_gemm.pack_linears(model)  # again: only the tied head is left to pack
    assert torch.allclose(model["head"](model["proj"](x)), expected, atol=1e-4, rtol=1e-5)
