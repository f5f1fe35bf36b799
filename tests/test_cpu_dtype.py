"""Which dtype a vLLM engine loads on a CPU (pure logic over the CPU's flags): float32 where
bf16 is not native, the checkpoint's dtype where it is or where the flags are unknown, and
always what the engine was given explicitly."""

from __future__ import annotations

import pytest

from teola_plugin.engines import cpu_dtype


@pytest.fixture
def cpu(monkeypatch):
    def use(flags, machine="x86_64", vllm_on_cpu=True):
        monkeypatch.setattr(cpu_dtype, "cpu_flags", lambda: None if flags is None else frozenset(flags))
        monkeypatch.setattr(cpu_dtype.platform, "machine", lambda: machine)
        monkeypatch.setattr(cpu_dtype, "_vllm_on_cpu", lambda: vllm_on_cpu)
    return use


def test_float32_where_bf16_would_be_emulated_and_the_checkpoints_dtype_where_it_is_native(cpu):
    cpu({"avx", "avx2", "fma"})
    assert cpu_dtype.best_cpu_dtype() == "float32" and cpu_dtype.loaded_dtype("auto") == "float32"
    cpu({"avx2", "avx512f", "avx512_bf16"})
    assert cpu_dtype.loaded_dtype("auto") == "auto"
    cpu({"fp", "asimd", "bf16"}, machine="aarch64")  # an Arm "Features" line
    assert cpu_dtype.loaded_dtype("auto") == "auto"


def test_unknown_flags_a_gpu_or_an_explicit_dtype_keep_what_was_given(cpu):
    cpu(None)
    assert cpu_dtype.loaded_dtype("auto") == "auto"
    cpu({"avx2"}, machine="riscv64")
    assert cpu_dtype.loaded_dtype("auto") == "auto"
    cpu({"avx2"}, vllm_on_cpu=False)
    assert cpu_dtype.loaded_dtype("auto") == "auto"
    cpu({"avx2"})
    assert cpu_dtype.loaded_dtype("bfloat16") == "bfloat16" and cpu_dtype.loaded_dtype("float16") == "float16"


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/cpuinfo").exists(), reason="no /proc/cpuinfo")
def test_this_machines_flags_are_read():
    flags = cpu_dtype.cpu_flags()
    assert flags and ("sse2" in flags or "fp" in flags)  # every x86_64 has SSE2, every aarch64 FP


def test_a_benchmark_names_the_cpu_its_widest_vector_extension_and_whether_bf16_is_native(cpu, monkeypatch):
    monkeypatch.setattr(cpu_dtype, "_cpu_model", lambda: "AMD EPYC")
    cpu({"avx", "avx2", "fma"})
    assert cpu_dtype.describe_cpu() == "AMD EPYC, AVX2, bf16 emulated"
    monkeypatch.setattr(cpu_dtype, "_cpu_model", lambda: "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz")
    cpu({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    assert cpu_dtype.describe_cpu() == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz, AMX, bf16 native"
    cpu({"avx2", "avx512f"})  # AVX-512 without its BF16 extension
    assert cpu_dtype.describe_cpu().endswith(", AVX-512, bf16 emulated")
    monkeypatch.setattr(cpu_dtype, "_cpu_model", lambda: "")
    cpu(None)  # nothing readable: the platform's word for it
    assert cpu_dtype.describe_cpu() == (cpu_dtype.platform.processor() or "cpu")
