"""Run Triton kernels on the CPU through the interpreter (set before anything imports triton)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")


if os.environ.get("TRITON_INTERPRET") == "1":
    from ops.testing import patch_interpreter_bf16

    patch_interpreter_bf16()
