"""Engine profiles of deployments this machine cannot run, from published hardware figures.

A :class:`Deployment` says which GPU serves the LLM (and which model), and where the
embedder and the reranker run: a GPU of their own, or the host's CPU cores (the measured
profile). Its :meth:`profile` is a cost-model profile (the ``engine_profiles.json``
format) built by a roofline from the GPU's datasheet figures and the model's size; its
:meth:`compute_groups` put each engine on its hardware. Every assumption is a named
constant below and is listed by :meth:`assumptions`, so a page quoting a prediction can
say what it rests on. A profile measured on a real GPU (``scripts/bench_engines.py``
there) replaces all of this: pass it to ``teola simulate --profile``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gb_s: float  # datasheet memory bandwidth
    fp16_tflops: float  # datasheet dense FP16 tensor throughput (FP32 accumulate)


@dataclass(frozen=True)
class Model:
    name: str
    params_b: float  # billions of parameters (FP16 weights: 2 bytes each)


GPUS = {g.name: g for g in (
    GPU("rtx3090", 936.0, 71.0),
    GPU("a100-40gb", 1555.0, 312.0),
    GPU("l4", 300.0, 121.0),
    GPU("h100-sxm", 3350.0, 989.0),
)}
MODELS = {m.name: m for m in (
    Model("smollm2-135m", 0.135),
    Model("llama-2-7b", 6.74),
    Model("llama-3-8b", 8.03),
    Model("llama-2-13b", 13.0),
)}

# What `teola simulate` predicts by default: GPU:MODEL, ":host" keeps the encoders on the host CPU.
DEFAULT_DEPLOYMENTS = ("rtx3090:llama-2-7b", "a100-40gb:llama-3-8b", "l4:llama-3-8b:host")

# Roofline efficiencies and fixed costs (typical of vLLM on these GPUs; assumptions, not measurements).
BANDWIDTH_EFFICIENCY = 0.7  # share of datasheet bandwidth a decode step reads weights at
PREFILL_MFU = 0.5  # share of datasheet FLOPs a prefill reaches
STEP_OVERHEAD_S = 0.004  # scheduler, sampling and launch time of one vLLM step
REQUEST_OVERHEAD_S = 0.010  # per engine call of a prefill (tokenization, scheduling)
# A MiniLM-L6 bi-encoder on a GPU: ~0.2 ms per ~160-token passage at large batches plus
# ~5 ms per call (sentence-transformers' own figures put it at thousands of sentences/s).
ENCODER_CALL_S = 0.005
ENCODER_ITEM_S = 0.0002


@dataclass(frozen=True)
class Deployment:
    gpu: GPU
    model: Model
    encoders_on_gpu: bool = True  # embedder and reranker on a GPU of their own (else the host's cores)

    @classmethod
    def named(cls, gpu: str, model: str, encoders_on_gpu: bool = True) -> Deployment:
        if gpu not in GPUS:
            raise ConfigError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)}")
        if model not in MODELS:
            raise ConfigError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
        return cls(GPUS[gpu], MODELS[model], encoders_on_gpu)

    @property
    def name(self) -> str:
        where = "encoders on a second GPU" if self.encoders_on_gpu else "encoders on the host CPU"
        return f"{self.model.name} on one {self.gpu.name}, {where}"

    def decode_step_s(self, sequences: int) -> float:
        """One step of ``sequences``: read the weights once, compute 2 FLOPs per weight per sequence."""
        weights = 2.0 * self.model.params_b * 1e9
        read = weights / (self.gpu.memory_gb_s * 1e9 * BANDWIDTH_EFFICIENCY)
        compute = 2.0 * self.model.params_b * 1e9 * sequences / (self.gpu.fp16_tflops * 1e12 * PREFILL_MFU)
        return STEP_OVERHEAD_S + max(read, compute)

    def prefill_s(self, tokens: float) -> float:
        flops = 2.0 * self.model.params_b * 1e9 * tokens
        return REQUEST_OVERHEAD_S + max(flops / (self.gpu.fp16_tflops * 1e12 * PREFILL_MFU), self.decode_step_s(1))

    def profile(self) -> dict[str, Any]:
        """Profiles for the engines that move to GPUs; the rest keep the measured host profile."""
        prefill_tokens = [16, 256, 1024, 4096]
        llm = {
            "llm_prefill": {"batch": prefill_tokens, "latency_s": [self.prefill_s(t) for t in prefill_tokens]},
            "llm_partial_prefill": {"batch": prefill_tokens, "latency_s": [self.prefill_s(t) for t in prefill_tokens]},
            "llm_decode": {"batch": [1, 64, 512], "latency_s": [n * self.decode_step_s(1) for n in (1, 64, 512)]},
            # 64 tokens of each of 1, 8, 32, 128 sequences stepping together
            "llm_decode_concurrent": {"batch": [64 * n for n in (1, 8, 32, 128)],
                                      "latency_s": [64 * self.decode_step_s(n) for n in (1, 8, 32, 128)]},
        }
        out: dict[str, Any] = {"llm": llm}
        if self.encoders_on_gpu:
            sizes = [1, 8, 64, 256]
            curve = {"batch": sizes, "latency_s": [ENCODER_CALL_S + ENCODER_ITEM_S * n for n in sizes]}
            out["embedder"] = {"embed": curve}
            out["reranker"] = {"rerank": curve}
        return out

    def compute_groups(self) -> dict[str, str]:
        """Engine kind -> hardware: the LLM on gpu:0, the encoders on gpu:1 or the host."""
        encoders = "gpu:1" if self.encoders_on_gpu else "cpu:host"
        return {"llm": "gpu:0", "embedder": encoders, "reranker": encoders}

    def assumptions(self) -> list[str]:
        return [
            f"{self.model.name}: {self.model.params_b:g}B parameters, FP16 weights",
            f"{self.gpu.name}: {self.gpu.memory_gb_s:g} GB/s, {self.gpu.fp16_tflops:g} dense FP16 TFLOPS (datasheet)",
            f"decode step = {STEP_OVERHEAD_S * 1e3:g} ms + max(weights / ({BANDWIDTH_EFFICIENCY:g} x bandwidth), "
            f"2 x params x sequences / ({PREFILL_MFU:g} x FLOPS)): {self.decode_step_s(1) * 1e3:.1f} ms at 1 "
            f"sequence, {self.decode_step_s(32) * 1e3:.1f} ms at 32",
            f"prefill = {REQUEST_OVERHEAD_S * 1e3:g} ms + 2 x params x tokens / ({PREFILL_MFU:g} x FLOPS): "
            f"{self.prefill_s(512) * 1e3:.1f} ms for 512 tokens",
            (f"embedder and reranker (MiniLM-L6) on a GPU of their own: {ENCODER_CALL_S * 1e3:g} ms + "
             f"{ENCODER_ITEM_S * 1e3:g} ms per passage" if self.encoders_on_gpu
             else "embedder and reranker on the host's CPU cores, as measured here"),
            "vector store, BM25 search and framework code on the host's CPU, as measured here",
            "the apps' prompts and answers as recorded with SmolLM2-135M (tokens, not words, carry over)",
        ]
