"""Edges of the native kernels' set-up (models/native.py) that hold on any machine: test_native and
test_native_attention skip where `load()` is None, so a set-up that wrongly turned the kernels off everywhere would
skip them all rather than fail."""

import ctypes
import logging
from types import SimpleNamespace

import pytest

from minipic_lite.models import native


def test_the_kernels_are_on_by_default_where_linux_a_compiler_and_libgomp_are(monkeypatch):
    monkeypatch.delenv(native.ENV_SWITCH, raising=False)
    monkeypatch.setattr(native.platform, "system", lambda: "Linux")
    monkeypatch.setattr(native, "_compiler", lambda: "cc")
    monkeypatch.setattr(native, "_torch_uses_gnu_openmp", lambda: True)
    assert native._unavailable() is None
    monkeypatch.setenv(native.ENV_SWITCH, "0")
    assert native._unavailable() == "MINIPIC_NATIVE=0"


@pytest.mark.parametrize(
    ("switch", "level", "reason"),
    [("1", logging.WARNING, "no C compiler (cc or gcc) on PATH"), ("0", logging.INFO, "MINIPIC_NATIVE=0")],
    ids=["no-compiler", "switched-off"],
)
def test_kernels_off_for_want_of_a_compiler_warn_and_off_by_the_users_switch_only_inform(
    monkeypatch, caplog, switch, level, reason
):
    """Nothing configures logging, so only a warning reaches stderr: a machine without a compiler decodes slower and
    says why; MINIPIC_NATIVE=0 is the user's own choice and stays out of sight."""
    monkeypatch.setenv(native.ENV_SWITCH, switch)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    monkeypatch.setattr(native.platform, "system", lambda: "Linux")
    native.load.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger=native.logger.name):
            assert native.load() is None
    finally:
        native.load.cache_clear()
    assert [(r.levelno, reason in r.getMessage()) for r in caplog.records] == [(level, True)]


def test_clang_is_told_to_link_torchs_openmp_runtime():
    """Clang's own -fopenmp links LLVM's libomp (a second thread pool beside torch's libgomp, and often absent)."""
    gcc = native.compiler_flags("cc (Debian 12.2.0-14) 12.2.0")
    clang = native.compiler_flags("Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu")
    assert gcc == native.FLAGS and "-fopenmp" in gcc
    assert "-fopenmp=libgomp" in clang and "-fopenmp" not in clang and len(clang) == len(gcc)


def test_the_compiler_is_cc_then_gcc_on_path_unless_cc_names_one(monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    on_path = {"cc": "/usr/bin/cc", "gcc": "/usr/bin/gcc"}
    monkeypatch.setattr(native.shutil, "which", lambda name: on_path.get(name))
    assert native._compiler() == "/usr/bin/cc"
    del on_path["cc"]  # a machine with gcc alone
    assert native._compiler() == "/usr/bin/gcc"
    monkeypatch.setenv("CC", "/opt/bin/clang")
    assert native._compiler() == "/opt/bin/clang"


def test_torchs_libgomp_is_found_by_its_path_in_the_process_maps(monkeypatch, tmp_path):
    """/proc/self/maps: address, permissions, offset, device, inode, then the mapped file's path."""
    maps = tmp_path / "maps"
    monkeypatch.setattr(native, "Path", lambda path: maps)
    maps.write_text(
        "7f1c00000000-7f1c00028000 r--p 00000000 08:01 1311 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f1c10000000-7f1c10009000 r-xp 00004000 08:01 2622 /venv/torch/lib/libgomp-a34b3233.so.1\n"
    )
    assert native.libgomp_path() == "/venv/torch/lib/libgomp-a34b3233.so.1" and native._torch_uses_gnu_openmp()
    maps.write_text("7f1c00000000-7f1c00028000 r--p 00000000 08:01 1311 /usr/lib/libiomp5.so\n")  # Intel's OpenMP
    assert native.libgomp_path() is None and not native._torch_uses_gnu_openmp()
    maps.unlink()  # no /proc: not Linux
    assert native.libgomp_path() is None


def test_with_nothing_in_the_way_load_returns_the_library_typed_as_its_c_declarations(monkeypatch, tmp_path):
    """gemv_*: 3 pointers, 3 int64 and an int; decode_attention: 7 pointers, 6 int64, an int, a float and an int,
    returning an int (the C source's signatures)."""
    kernels = {name: SimpleNamespace() for name in ("gemv_bf16", "gemv_f32", "decode_attention")}
    opened = []
    monkeypatch.setattr(native, "_unavailable", lambda: None)
    monkeypatch.setattr(native, "_build", lambda: tmp_path / "kernels.so")
    monkeypatch.setattr(native.ctypes, "CDLL", lambda path: opened.append(path) or SimpleNamespace(**kernels))
    native.load.cache_clear()
    try:
        lib = native.load()
    finally:
        native.load.cache_clear()
    assert lib is not None and opened == [str(tmp_path / "kernels.so")]
    ptr, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    for gemv in (lib.gemv_bf16, lib.gemv_f32):
        assert gemv.argtypes == [ptr, ptr, ptr, i64, i64, i64, i32] and gemv.restype is None
    attention = lib.decode_attention
    assert attention.argtypes == [ptr] * 7 + [i64] * 6 + [i32, ctypes.c_float, i32] and attention.restype is i32


def test_the_first_build_on_a_machine_makes_the_cache_directory(monkeypatch, tmp_path):
    compiler = tmp_path / "fake-cc"  # writes a stand-in library where `-o` tells it to
    script = ["#!/bin/sh", '[ "$1" = --version ] && exit 0', 'while [ "$1" != -o ]; do shift; done', 'echo lib > "$2"']
    compiler.write_text("\n".join([*script, ""]))
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    monkeypatch.setenv("MINIPIC_CACHE_DIR", str(tmp_path / "not" / "yet"))
    path = native._build()
    assert path.parent == tmp_path / "not" / "yet" / "native" and path.read_text() == "lib\n"
