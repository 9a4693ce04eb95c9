"""bfloat16 on a CPU without bfloat16 instructions: one warning line, from /proc/cpuinfo's
instruction sets, when a model is loaded or trained that way, and none otherwise."""

from __future__ import annotations

import logging

import pytest

from nmt.runtime import cpu_features
from nmt.runtime.cpu_features import bfloat16_warning, cpu_flags, has_bfloat16_products

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu vme sse2 avx2 avx512f avx512_bf16 avx512_vnni
processor\t: 1
flags\t\t: fpu vme sse2 avx2 avx512f avx512_bf16 avx512_vnni
"""
SAPPHIRE_RAPIDS = "flags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n"
ICE_LAKE = "model name\t: Intel Xeon\nflags\t\t: fpu avx2 avx512f avx512_vnni avx512bw\n"
NEOVERSE_V1 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
NEOVERSE_N1 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32\n"
NO_FLAGS = "processor\t: 0\nmodel name\t: something virtual\n"


def test_flags_are_read_from_x86_and_arm_lines():
    assert cpu_flags(ZEN4) == {"fpu", "vme", "sse2", "avx2", "avx512f", "avx512_bf16",
                               "avx512_vnni"}
    assert cpu_flags(NEOVERSE_V1) == {"fp", "asimd", "sve", "bf16", "i8mm"}
    assert cpu_flags(NO_FLAGS) == set()


@pytest.mark.parametrize("cpuinfo, expected", [
    (ZEN4, True), (SAPPHIRE_RAPIDS, True), (NEOVERSE_V1, True),
    (ICE_LAKE, False), (NEOVERSE_N1, False),
    (NO_FLAGS, None),  # nothing listed: unknown, not "no"
])
def test_bfloat16_instructions(cpuinfo, expected):
    assert has_bfloat16_products(cpuinfo) is expected


def test_unreadable_cpuinfo_is_unknown(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_features, "CPUINFO", tmp_path / "absent")
    assert has_bfloat16_products() is None
    assert bfloat16_warning("cpu", "bfloat16") is None


def test_the_warning_only_for_bfloat16_on_a_cpu_without_the_instructions():
    warning = bfloat16_warning("cpu", "bfloat16", ICE_LAKE)
    assert warning is not None and "\n" not in warning
    assert "avx512_bf16" in warning and "--dtype float32" in warning
    assert bfloat16_warning("cpu", "float32", ICE_LAKE) is None
    assert bfloat16_warning("cpu", "bfloat16", ZEN4) is None
    assert bfloat16_warning("gpu", "bfloat16", ICE_LAKE) is None
    assert bfloat16_warning("cpu", "bfloat16", NO_FLAGS) is None


@pytest.mark.parametrize("dtype, cpuinfo, warned", [
    ("bfloat16", ICE_LAKE, True), ("bfloat16", ZEN4, False), ("float32", ICE_LAKE, False),
])
def test_loading_a_model_warns_once(run_dir, tmp_path, monkeypatch, caplog, dtype, cpuinfo,
                                    warned):
    from nmt.models import model_dir

    fake = tmp_path / "cpuinfo"
    fake.write_text(cpuinfo)
    monkeypatch.setattr(cpu_features, "CPUINFO", fake)
    model_dir._warn_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger=model_dir.__name__):
        model_dir.load_models([run_dir, run_dir], dtype=dtype)  # an ensemble: two loads
        model_dir.load_model(run_dir, dtype=dtype)
    model_dir._warn_once.cache_clear()
    lines = [r.getMessage() for r in caplog.records if "bfloat16 instructions" in r.getMessage()]
    assert len(lines) == (1 if warned else 0)
