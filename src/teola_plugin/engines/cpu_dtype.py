"""The dtype vLLM computes fastest in on this CPU.

vLLM's CPU backend runs a bfloat16 model (SmolLM2's checkpoint is one) in bfloat16 under
``dtype="auto"``. That is fast only where the CPU computes bf16 natively (x86 AVX512_BF16 or
AMX_BF16, Arm's BF16 extension); elsewhere (an AVX2-only x86, e.g.) every bf16 matrix
product is emulated. Measured on such a machine (2-core AMD EPYC, AVX2, SmolLM2-135M,
``scripts/compare_vllm_dtypes.py``): a new 630-token chat prefill took 2.6-3.0 s in bfloat16
and 0.6-0.7 s in float32; 64 tokens generated after a 500-800-token prompt 16.6-24.9 s against
6.7-9.2 s. So where bf16 is emulated the engines and the model servers Teola starts load the
model in float32 (twice the weights' memory: 0.5 GB for the bundled model).
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 flags; "bf16" in an Arm "Features" line


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags from ``/proc/cpuinfo`` (None where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def best_cpu_dtype() -> str:
    """``"float32"`` where bf16 would be emulated, else ``"auto"`` (the checkpoint's dtype)."""
    flags = cpu_flags()
    if flags is None or platform.machine().lower() not in ("x86_64", "amd64", "aarch64", "arm64"):
        return "auto"  # unknown: keep vLLM's choice
    return "auto" if flags & NATIVE_BF16_FLAGS else "float32"
