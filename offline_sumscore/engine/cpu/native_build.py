"""C++ kernels built through torch.utils.cpp_extension (g++ and ninja): all at once at set-up, else at first use.

Every kernel is compiled with tensor_api.h (the few torch headers the kernels and their bindings need, not
torch/extension.h) and exp16.h (e^x on 16 lanes) put before its own source. torch caches each build under
TORCH_EXTENSIONS_DIR (else ~/.cache/torch_extensions). `sumscore setup` (which `make setup` runs) builds every
kernel in parallel, one line each (build_every_kernel), so a first score builds nothing; a kernel not built there is
built at first use, announced on stderr rather than left as a silent pause. A failed build is remembered for the
process, with what the compiler said and where the cache lies, so the caller can say so loudly once and run torch's
own operators instead. A machine without a C++ compiler is told so in one line, before any build is tried.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import queue
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
SHARED = [HERE / "tensor_api.h", HERE / "exp16.h"]  # put before every kernel's own source
# The modules of engine/cpu/ that hold a kernel, each as its NATIVE; a test checks that every .cpp here is one's source
KERNEL_MODULES = ("block_codes", "layer_ops", "pick_kernel", "attention_kernel", "gguf_codes")
AVX512_FLAGS = ["-O3", "-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mfma", "-fopenmp"]


class NativeModule:
    """One C++ source compiled into a module of these functions; `what` names it in messages, `instead` says what
    runs where it cannot be built (and so what a failure costs)."""

    def __init__(
        self,
        source: Path,
        name: str,
        functions: list[str],
        what: str,
        seconds: int,
        instead: str,
        flags: list[str] | None = None,
        needs_avx512: bool = True,
    ):
        self.source, self.name, self.functions, self.what = source, name, functions, what
        self.seconds, self.instead, self.flags = seconds, instead, AVX512_FLAGS if flags is None else flags
        self.needs_avx512 = needs_avx512  # written in AVX-512 intrinsics; else plain C++ any CPU compiles
        self.built: dict[str, object] = {}  # "module" or "error", once per process
        self._lock = threading.Lock()

    def build(self, announce: bool = True):
        """The compiled module (built at first use, torch's cache after); raises RuntimeError naming what failed.
        announce: say on stderr that a first build is under way (set-up says so in its own lines)."""
        with self._lock:
            if "module" in self.built:
                return self.built["module"]
            if "error" in self.built:
                raise RuntimeError(self.built["error"])
            from torch.utils.cpp_extension import load_inline

            cached = self.cached()
            missing = None if cached else compiler_missing()
            if missing:
                self.built["error"] = f"{self.what} cannot be built: {missing}"
                raise RuntimeError(self.built["error"])
            if announce and not cached:
                print(f"offline_sumscore: building {self.what} (once; about {self.seconds} s)", file=sys.stderr)
            try:
                folder = self.folder()
                folder.mkdir(parents=True, exist_ok=True)
                module = load_inline(
                    name=self.name,
                    cpp_sources=self.sources(),
                    functions=self.functions,
                    extra_cflags=self.flags,
                    extra_ldflags=["-fopenmp"],  # torch's own libgomp, already loaded: one OpenMP runtime
                    verbose=False,
                    build_directory=str(folder),
                    no_implicit_headers=True,  # tensor_api.h holds what is needed, at a quarter of the build time
                )
            except Exception as e:  # the compiler, ninja or a broken cache: what it said, where it lies
                self.built["error"] = (
                    f"{self.what} ({self.source.name}) could not be built or loaded: "
                    f"{type(e).__name__}: {str(e).strip()[-600:]} (torch builds it under TORCH_EXTENSIONS_DIR, else "
                    f"~/.cache/torch_extensions: {self.folder()}; removing that folder forces a fresh build)"
                )
                raise RuntimeError(self.built["error"]) from e
            self.built["module"] = module
            return module

    def build_or_warn(self, stacklevel: int = 3):
        """(the compiled module, None), or (None, what failed) after a warning that says what failed and what runs
        instead. A missing compiler is said once a process, for every kernel."""
        try:
            return self.build(), None
        except RuntimeError as e:
            missing = compiler_missing()
            if not missing:  # at the caller's caller, as its own warning was
                warnings.warn(f"{e}. {self.instead}", stacklevel=stacklevel)
            elif not _said_no_compiler.is_set():  # one warning for every kernel
                _said_no_compiler.set()
                warnings.warn(f"{missing}: {NO_KERNELS}", stacklevel=stacklevel)
            return None, str(e)

    def build_on_avx512(self):
        """(the compiled module, None) on a CPU with AVX-512 where the build succeeds; else (None, why not, in a few
        words): this CPU's capability, or what failed, after build_or_warn's warning."""
        capability = without_avx512()
        if capability:
            return None, f"the kernel needs AVX-512; this CPU: {capability}"
        module, error = self.build_or_warn(stacklevel=4)
        return (module, None) if module is not None else (None, f"the kernel failed to build: {error}")

    def sources(self) -> list[str]:
        """The texts compiled, in order (load_inline writes them, then its bindings, into the build's main.cpp)."""
        return [p.read_text() for p in [*SHARED, self.source]]

    def folder(self) -> Path:
        """Where this kernel's build lies: under torch's extension root (TORCH_EXTENSIONS_DIR, else
        ~/.cache/torch_extensions), one folder per kernel and per torch installation. Two environments on one machine
        (.venv and .venv-vllm) compile against different include paths; sharing a folder, each would rebuild over the
        other's build at its next first use, silently, for half a minute."""
        import torch
        from torch.utils.cpp_extension import get_default_build_root

        root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
        installation = f"{Path(torch.__file__).resolve()}|{torch.__version__}|{sys.version}|{self.flags}"
        return Path(root) / f"{self.name}-{hashlib.sha256(installation.encode()).hexdigest()[:12]}"

    def built_at(self) -> float | None:
        """When the module in the build folder was last written (None: never)."""
        try:
            return (self.folder() / f"{self.name}.so").stat().st_mtime
        except OSError:
            return None

    def cached(self) -> bool:
        """Whether the build folder holds a build of these very sources (then loading it takes a fraction of a
        second; a build of older sources is rebuilt)."""
        try:
            compiled = self.folder() / "main.cpp"
            built = self.built_at()
            return (
                built is not None
                and compiled.read_text().startswith("\n".join(self.sources()))
                and built >= compiled.stat().st_mtime
            )
        except OSError:
            return False


def without_avx512() -> str | None:
    """This CPU's vector capability as torch names it (AVX2, DEFAULT...) where it lacks AVX-512, which every kernel
    here is written in; None where it has it."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    return None if "AVX512" in capability else capability


NO_KERNELS = (
    "the judge runs on torch's operators and oneDNN instead of the CPU kernels (slower, the same verdicts); install "
    "g++ (or set CXX) and run `sumscore setup`"
)
_said_no_compiler = threading.Event()


def compiler_missing() -> str | None:
    """Why no kernel can be built here, in a few words (no C++ compiler on PATH, or no ninja); None where one can."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        named = f"CXX={compiler} is not found" if "CXX" in os.environ else "`c++` is not on PATH; CXX names another"
        return f"no C++ compiler on this machine ({named})"
    try:
        from torch.utils.cpp_extension import is_ninja_available

        if not is_ninja_available():
            return "no ninja on PATH (pip install ninja)"
    except ImportError:
        pass
    return None


def every_kernel() -> list[NativeModule]:
    """The engine's C++ kernels, in KERNEL_MODULES' order."""
    return [importlib.import_module(f"offline_sumscore.engine.cpu.{name}").NATIVE for name in KERNEL_MODULES]


@dataclass
class KernelBuild:
    """What set-up did for one kernel: built (seconds), found in the cache, or failed (why, and what runs instead)."""

    kernel: NativeModule
    outcome: str  # "built", "cached" or "failed"
    seconds: float
    error: str | None = None

    def line(self) -> str:
        if self.outcome == "failed":
            return f"{self.kernel.what}: FAILED: {self.error}. {self.kernel.instead}"
        if self.outcome == "cached":
            return f"{self.kernel.what}: built before (torch's extension cache), loaded in {self.seconds:.1f} s"
        return f"{self.kernel.what}: built in {self.seconds:.1f} s"


def kernels_here() -> list[NativeModule]:
    """The kernels that apply to this CPU: all of them with AVX-512, else those written in plain C++."""
    avx512 = without_avx512() is None
    return [kernel for kernel in every_kernel() if avx512 or not kernel.needs_avx512]


def kernels_unusable() -> str | None:
    """Why some kernels do not apply to this machine (AVX-512 code on a CPU without it), and why none can be built (no
    compiler, and not every kernel in torch's cache already); None where neither holds."""
    said = []
    capability = without_avx512()
    if capability:
        skipped = sum(kernel.needs_avx512 for kernel in every_kernel())
        said.append(
            f"this CPU has no AVX-512 ({capability}): {skipped} of the C++ kernels do not apply (they are AVX-512 "
            "code); the embedded judge runs on torch's operators and oneDNN there (the same verdicts)"
        )
    if not can_build_here():
        said.append(f"{compiler_missing()}: {NO_KERNELS}")
    return "; ".join(said) or None


def can_build_here() -> bool:
    """Whether the kernels that apply here can be built or loaded: a compiler, or every one in torch's cache."""
    return not compiler_missing() or all(kernel.cached() for kernel in kernels_here())


def start_every_kernel_build(on_done=None) -> Callable[[], list[KernelBuild]]:
    """Start building (or loading from torch's cache) every kernel at once, one daemon thread each: the compilers run
    as processes of their own, so the builds overlap, and a daemon thread never holds the process at its exit, so
    Ctrl-C ends a set-up at once. on_done(KernelBuild) is called as each ends. Returns the wait for them all, in
    KERNEL_MODULES' order, interruptible. Raises nothing: a failure is a KernelBuild that says what failed and what
    runs instead."""
    kernels = kernels_here()
    ended: queue.SimpleQueue = queue.SimpleQueue()

    def one(i: int, kernel: NativeModule) -> None:
        before, started = kernel.built_at(), time.perf_counter()
        try:
            kernel.build(announce=False)
            rebuilt = kernel.built_at() != before  # what ninja did, not what the cache looked like before
            done = KernelBuild(kernel, "built" if rebuilt else "cached", time.perf_counter() - started)
        except RuntimeError as e:
            done = KernelBuild(kernel, "failed", time.perf_counter() - started, str(e))
        if on_done is not None:
            on_done(done)
        ended.put((i, done))

    for i, kernel in enumerate(kernels):
        threading.Thread(target=one, args=(i, kernel), daemon=True, name=f"kernel-build-{kernel.name}").start()

    def wait() -> list[KernelBuild]:
        builds: list[KernelBuild | None] = [None] * len(kernels)
        for _ in kernels:
            while True:  # in slices, so that Ctrl-C reaches the waiting thread at once
                try:
                    i, done = ended.get(timeout=0.5)
                    break
                except queue.Empty:
                    continue
            builds[i] = done
        return builds

    return wait


def build_every_kernel(on_done=None) -> list[KernelBuild]:
    """Every kernel built (or loaded from torch's cache) at once; see start_every_kernel_build."""
    return start_every_kernel_build(on_done)()
