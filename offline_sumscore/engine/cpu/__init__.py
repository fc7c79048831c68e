"""The CPU's own room: native kernels and host-side helpers that run only where the judge runs on a CPU, each used
where it applies and skipped, with the reason recorded, where it does not (a GPU, bfloat16, a CPU without AVX-512,
an emulated GPU). Nothing here ever sees a CUDA tensor.

- native_build.py      C++ built through torch.utils.cpp_extension (with tensor_api.h and exp16.h), cached by torch:
                       every kernel at once at set-up (`sumscore setup`, build_every_kernel), else at first use.
- cpu_gemm.py          a float32 judge's linears prepacked for oneDNN, their dense weights released.
- block_codes.py       the embedded judge's 4-bit GGUF codes multiplied as they are (block_codes.cpp, AVX-512).
- layer_ops.py         the decoder's norms, rotary embedding and MLP gate fused (layer_ops.cpp).
- attention_kernel.py  a ragged pass's attention in one call (attention_kernel.cpp).
- pick_kernel.py       the greedy picks under the grammar masks in one pass over the logits (pick_kernel.cpp).
- host_heap.py         glibc's heap handed back every few hundred passes, so a long run's memory stays flat.
"""
