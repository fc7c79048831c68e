"""The machine's peaks (a matmul and a copy, measured at the start of a run) and the physical floor they set for a
workload: max(FLOPs / peak FLOP/s, bytes / peak bytes/s)."""

from __future__ import annotations

import time

import torch

from offline_sumscore.engine.local.kv_slots import KVGeometry


def measure_peaks(device: torch.device, dtype: torch.dtype) -> dict:
    """Best-of-3 matmul FLOP/s and copy bytes/s on this device, in the judge's dtype."""
    # float16 on a CPU is mostly emulated: a smaller matmul measures the same peak. bfloat16 runs on AMX/AVX512-BF16
    # units where the CPU has them, and needs the full size to reach its peak.
    n = 4096 if device.type == "cuda" else 256 if dtype == torch.float16 else 1024
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    big = torch.empty(int(2**30 if device.type == "cuda" else 2**28) // 4, device=device, dtype=torch.float32)

    def timed(fn, reps):
        best = float("inf")
        for _ in range(3):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t) / reps)
        return best

    mm = timed(lambda: a @ b, 10)
    copy = timed(lambda: big.clone(), 5)
    return {
        "flops_per_s": 2 * n**3 / mm,
        "bytes_per_s": 2 * big.numel() * 4 / copy,
        "matmul_n": n,
        "dtype": str(dtype).replace("torch.", ""),
    }


def physical_floor(judge, peaks, processed_tokens, read_tokens, forward_passes, avg_context) -> float:
    cfg = judge.model.config
    # The decoder's weights run for every token; the vocabulary projection only where a token is read. A tied
    # head shares the embedding matrix but is still read from memory on every pass.
    body = sum(p.numel() for n, p in judge.model.named_parameters() if "embed_tokens" not in n and "lm_head" not in n)
    # A packed linear's dense weight was released (cpu_gemm.pack_linears): count it from its features.
    head = judge.model.get_output_embeddings()
    released = [
        m for m in judge.model.modules() if isinstance(m, torch.nn.Linear) and m.weight is None and m is not head
    ]
    body += sum(m.in_features * m.out_features for m in released)
    elem = judge.model.dtype.itemsize
    lm_head = cfg.hidden_size * cfg.vocab_size
    params = body + lm_head
    flops = 2 * body * processed_tokens + 2 * lm_head * read_tokens
    kv_per_token = KVGeometry.of(cfg, judge.model.dtype).bytes_per_token
    bytes_ = params * elem * forward_passes + kv_per_token * avg_context * read_tokens
    return max(flops / peaks["flops_per_s"], bytes_ / peaks["bytes_per_s"])
