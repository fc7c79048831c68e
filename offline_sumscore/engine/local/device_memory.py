"""The device's memory as the engine counts it: how much there is and is free, how much a pass takes at its peak,
what counts as running out, and a GPU's memory emulated on the CPU.

- HostMemory, a CPU: RAM, paid for page by page when first touched, so buffers are allocated large and left to grow.
  The engine sizes as it always has there (capacity.py: half the available RAM).
- CudaMemory, a GPU: torch.cuda's figures. Bounded: the keys and values are sized once from a share of the device's
  total memory, less the weights and a measured activation peak, as vLLM sizes its cache, and every KV allocation
  draws from that budget (kv_budget.py).
- EmulatedGpuMemory: OFFLINE_SUMSCORE_DEVICE_MEMORY=<MiB> on a CPU. The engine takes its GPU branches (the budget,
  the slots that follow the live rows, SDPA's attention calls, torch's picks, the GPU's defaults) and every tensor
  allocated while it runs is counted, the judge's weights included, as torch.cuda.mem_get_info counts them; an
  allocation past the given memory raises torch.OutOfMemoryError, as CUDA's allocator does. What it cannot emulate:
  speed, the caching allocator's fragmentation, a fused kernel's own workspace, and CUDA's bfloat16 numerics.

Out of memory is more than torch.OutOfMemoryError: cuBLAS and cuDNN report a failed allocation of their workspace as
a RuntimeError, and so does the CPU's allocator (is_out_of_memory).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager, nullcontext

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from offline_sumscore.core.errors import UsageError

DEVICE_MEMORY_ENV = "OFFLINE_SUMSCORE_DEVICE_MEMORY"
MIB = 2**20

# What libraries say when they could not allocate, where they raise a plain RuntimeError: cuBLAS's and cuDNN's
# workspaces, a CUDA call's own allocation, the CPU's allocator.
OUT_OF_MEMORY_TEXTS = (
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
    "CUDA error: out of memory",
    "cudaErrorMemoryAllocation",
    "CUDA out of memory",
    "DefaultCPUAllocator: can't allocate memory",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether an error means that an allocation failed (the work may run in less), whatever raised it."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(text in str(exc) for text in OUT_OF_MEMORY_TEXTS)


def emulated_memory_mib() -> int | None:
    """OFFLINE_SUMSCORE_DEVICE_MEMORY in MiB, or None when it is not set."""
    given = os.environ.get(DEVICE_MEMORY_ENV, "").strip()
    if not given:
        return None
    try:
        mib = int(given)
    except ValueError:
        mib = 0
    if mib <= 0:
        raise UsageError(
            f"{DEVICE_MEMORY_ENV} must be a whole number of MiB, the emulated GPU's memory (e.g. 2048). Given: {given}"
        )
    return mib


class DeviceMemory:
    """One device's memory. bounded: a fixed amount the engine must count (a GPU's, or an emulated one)."""

    kind = "cpu"
    bounded = False

    def total(self) -> int:
        raise NotImplementedError

    def free(self) -> int:
        """Bytes a new allocation may take now."""
        raise NotImplementedError

    def tracking(self):
        """Entered while the engine works: where memory is emulated, every allocation in it is counted."""
        return nullcontext()

    @contextmanager
    def measuring(self):
        """Yields a dict whose "peak" is, on leaving, the most bytes held above the start at any moment inside (None
        where the device cannot tell)."""
        yield {"peak": None}

    def register(self, model) -> None:
        """The judge's weights, loaded before the engine: counted where memory is emulated."""

    def release_cached(self) -> None:
        """After running out: blocks the allocator caches but nothing uses go back to the device."""

    def describe(self) -> str:
        return self.kind


class HostMemory(DeviceMemory):
    """A CPU's RAM (capacity.py sizes the engine from what Linux says is available)."""


class CudaMemory(DeviceMemory):
    kind, bounded = "cuda", True

    def __init__(self, device):
        self.device = torch.device(device)

    def total(self) -> int:
        return torch.cuda.mem_get_info(self.device)[1]

    def free(self) -> int:
        # Memory PyTorch's caching allocator holds but does not use is free to this process too.
        spare = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return torch.cuda.mem_get_info(self.device)[0] + max(0, spare)

    @contextmanager
    def measuring(self):
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        start, found = torch.cuda.memory_allocated(self.device), {"peak": None}
        try:
            yield found
        finally:
            torch.cuda.synchronize(self.device)
            found["peak"] = torch.cuda.max_memory_allocated(self.device) - start

    def release_cached(self) -> None:
        torch.cuda.empty_cache()

    def describe(self) -> str:
        return f"cuda: {torch.cuda.get_device_name(self.device)}, {self.total() / 2**30:.1f} GiB"


class EmulatedGpuMemory(DeviceMemory):
    """A GPU of `cap` bytes on the CPU (module docstring). Counts the storages of every tensor an operation returns
    while tracking() is entered, and of the weights registered; a storage stops counting when it is freed."""

    kind, bounded = "emulated", True

    def __init__(self, cap: int):
        self.cap = cap
        self.live: dict[int, tuple] = {}  # storage address -> (a weak reference to it, its bytes)
        self.used = 0  # bytes of live storages, and of freed ones not yet pruned: exact after prune()
        self.peak = 0
        self.refusals = 0  # allocations refused (emulated out-of-memory errors raised)
        self._lock = threading.RLock()
        self._mode = None

    def total(self) -> int:
        return self.cap

    def free(self) -> int:
        with self._lock:
            self.prune()
            return max(0, self.cap - self.used)

    def tracking(self):
        if getattr(_tracked, "on", False):  # already counted in this thread: one mode, not two
            return nullcontext()
        return _Allocations(self)

    @contextmanager
    def measuring(self):
        with self._lock:
            self.prune()
            start = self.peak = self.used
        found = {"peak": None}
        try:
            yield found
        finally:
            found["peak"] = self.peak - start

    def register(self, model) -> None:
        for tensor in [*model.parameters(), *model.buffers()]:
            self.saw(tensor, refuse=False)

    def release_cached(self) -> None:
        with self._lock:
            self.prune()

    def describe(self) -> str:
        return f"emulated GPU of {self.cap // MIB} MiB on the CPU ({DEVICE_MEMORY_ENV})"

    # -- counting ---------------------------------------------------------------------------------------------
    def saw(self, tensor: torch.Tensor, refuse: bool = True) -> None:
        """A tensor an operation returned: its storage counts from now on, unless it is counted already. Raises
        torch.OutOfMemoryError (the storage not counted) where it takes the device past its memory."""
        from torch.multiprocessing.reductions import StorageWeakRef

        try:
            storage = tensor.untyped_storage()
            address, size = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # a tensor without storage (meta, a wrapper subclass)
            return
        if not size or tensor.device.type != "cpu":
            return
        with self._lock:
            known = self.live.get(address)
            if known is not None and not known[0].expired() and known[1] == size:
                return
            if known is not None:  # that address was freed, and this storage took it
                self.used -= known[1]
            self.live[address] = (StorageWeakRef(storage), size)
            self.used += size
            if self.used > self.peak or (refuse and self.used > self.cap):
                self.prune()  # exact before refusing or raising the peak
            if refuse and self.used > self.cap:
                del self.live[address]
                self.used -= size
                self.refusals += 1
                raise torch.OutOfMemoryError(
                    f"emulated GPU out of memory: tried to allocate {size / MIB:.1f} MiB with {self.used / MIB:.1f} "
                    f"MiB of {self.cap // MIB} MiB in use ({DEVICE_MEMORY_ENV})"
                )
            self.peak = max(self.peak, self.used)

    def prune(self) -> None:
        """Forget the storages that were freed: `used` is exact after it."""
        gone = [address for address, (ref, _) in self.live.items() if ref.expired()]
        for address in gone:
            self.used -= self.live.pop(address)[1]


_tracked = threading.local()


class _Allocations(TorchDispatchMode):
    """Every operation's outputs go through EmulatedGpuMemory.saw: each new storage is counted, or refused."""

    def __init__(self, memory: EmulatedGpuMemory):
        super().__init__()
        self.memory = memory

    def __enter__(self):
        _tracked.on = True
        return super().__enter__()

    def __exit__(self, *exc):
        _tracked.on = False
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.memory.saw(leaf)
        return out


_emulated: dict[int, EmulatedGpuMemory] = {}  # one emulated device per size, for the whole process, as a GPU is


def device_memory(device) -> DeviceMemory:
    """The memory of the device a judge runs on: its GPU's, an emulated GPU's (OFFLINE_SUMSCORE_DEVICE_MEMORY set
    on a CPU), or the host's."""
    device = torch.device(device)
    if device.type == "cuda":
        return CudaMemory(device)
    mib = emulated_memory_mib()
    if mib is None or device.type != "cpu":
        return HostMemory()
    if mib not in _emulated:
        _emulated[mib] = EmulatedGpuMemory(mib * MIB)
    return _emulated[mib]
