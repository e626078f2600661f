"""Edges of the native kernels' set-up (models/native.py) that hold on any machine: test_native and
test_native_attention skip where `load()` is None, so a set-up that wrongly turned the kernels off everywhere would
skip them all rather than fail."""

from minipic_lite.models import native


def test_the_kernels_are_on_by_default_where_linux_a_compiler_and_libgomp_are(monkeypatch):
    monkeypatch.delenv(native.ENV_SWITCH, raising=False)
    monkeypatch.setattr(native.platform, "system", lambda: "Linux")
    monkeypatch.setattr(native, "_compiler", lambda: "cc")
    monkeypatch.setattr(native, "_torch_uses_gnu_openmp", lambda: True)
    assert native._unavailable() is None
    monkeypatch.setenv(native.ENV_SWITCH, "0")
    assert native._unavailable() == "MINIPIC_NATIVE=0"


def test_clang_is_told_to_link_torchs_openmp_runtime():
    """Clang's own -fopenmp links LLVM's libomp (a second thread pool beside torch's libgomp, and often absent)."""
    gcc = native.compiler_flags("cc (Debian 12.2.0-14) 12.2.0")
    clang = native.compiler_flags("Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu")
    assert gcc == native.FLAGS and "-fopenmp" in gcc
    assert "-fopenmp=libgomp" in clang and "-fopenmp" not in clang and len(clang) == len(gcc)
