# Sourced before anything that runs the engines (see ENV-NOTES in the design docs):
# offline model loading, a small CPU KV cache, both cores for vLLM's OpenMP threads.
# Values already set by the user win. (Ray auth: left to the runtime — a per-process token.)
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-0-$(( $(nproc) - 1 ))}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
export ANONYMIZED_TELEMETRY="${ANONYMIZED_TELEMETRY:-False}"
# vLLM's OpenMP threads spin after each request and starve the other engines on a small
# CPU (ENV-NOTES: a 12 ms embedding took 450 ms); passive waiting costs ~17% decode speed.
# Same setting for every system compared in a benchmark.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
