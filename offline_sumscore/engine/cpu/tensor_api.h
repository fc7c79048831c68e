// The part of torch's C++ API the kernels use, and what the bindings load_inline writes for them need (the tensor
// type caster, torch::wrap_pybind_function): a few headers in place of torch/extension.h, which pulls in the whole
// C++ frontend (autograd, nn, optim, serialization) and takes most of each kernel's build time.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>
