"""C++ kernels built at first use through torch.utils.cpp_extension (g++ and ninja), once per process.

Every kernel is compiled with exp16.h (e^x on 16 lanes) put before its own source. torch caches each build under
TORCH_EXTENSIONS_DIR (else ~/.cache/torch_extensions), so only a machine's first run pays for it; a first build is
announced on stderr rather than left as a silent pause. A failed build is remembered for the process, with what
the compiler said and where the cache lies, so the caller can say so loudly once and run torch's own operators
instead.
"""

from __future__ import annotations

import sys
import threading
import warnings
from pathlib import Path

SHARED = [Path(__file__).with_name("exp16.h")]  # put before every kernel's own source
AVX512_FLAGS = ["-O3", "-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mfma", "-fopenmp"]


class NativeModule:
    """One C++ source compiled into a module of these functions; `what` names it in messages."""

    def __init__(self, source: Path, name: str, functions: list[str], what: str, seconds: int, flags: list[str]):
        self.source, self.name, self.functions, self.what = source, name, functions, what
        self.seconds, self.flags = seconds, flags
        self.built: dict[str, object] = {}  # "module" or "error", once per process
        self._lock = threading.Lock()

    def build(self):
        """The compiled module (built at first use, torch's cache after); raises RuntimeError naming what failed."""
        with self._lock:
            if "module" in self.built:
                return self.built["module"]
            if "error" in self.built:
                raise RuntimeError(self.built["error"])
            from torch.utils.cpp_extension import load_inline

            if not self.cached():
                print(f"offline_sumscore: building {self.what} (once; about {self.seconds} s)", file=sys.stderr)
            try:
                module = load_inline(
                    name=self.name,
                    cpp_sources=[p.read_text() for p in [*SHARED, self.source]],
                    functions=self.functions,
                    extra_cflags=self.flags,
                    extra_ldflags=["-fopenmp"],  # torch's own libgomp, already loaded: one OpenMP runtime
                    verbose=False,
                )
            except Exception as e:  # the compiler, ninja or a broken cache: what it said, where it lies
                self.built["error"] = (
                    f"{self.what} ({self.source.name}) could not be built or loaded: "
                    f"{type(e).__name__}: {str(e).strip()[-600:]} (torch builds it under TORCH_EXTENSIONS_DIR, else "
                    "~/.cache/torch_extensions; removing that folder forces a fresh build)"
                )
                raise RuntimeError(self.built["error"]) from e
            self.built["module"] = module
            return module

    def build_or_warn(self, instead: str, stacklevel: int = 3):
        """(the compiled module, None), or (None, what failed) after a warning that says what failed and, in the
        caller's words, what runs instead."""
        try:
            return self.build(), None
        except RuntimeError as e:
            warnings.warn(f"{e}. {instead}", stacklevel=stacklevel)  # at the caller's caller, as its own warning was
            return None, str(e)

    def build_on_avx512(self, instead: str):
        """(the compiled module, None) on a CPU with AVX-512 where the build succeeds; else (None, why not, in a few
        words): this CPU's capability, or what failed, after build_or_warn's warning."""
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
        if "AVX512" not in capability:
            return None, f"the kernel needs AVX-512; this CPU: {capability}"
        module, error = self.build_or_warn(instead, stacklevel=4)
        return (module, None) if module is not None else (None, f"the kernel failed to build: {error}")

    def cached(self) -> bool:
        """Whether torch's extension cache holds a build (then loading it takes a fraction of a second)."""
        try:
            from torch.utils.cpp_extension import _get_build_directory

            return (Path(_get_build_directory(self.name, False)) / f"{self.name}.so").exists()
        except Exception:  # a private helper of torch's: where it is missing or moved, the message shows every time
            return False
