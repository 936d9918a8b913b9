"""benchmarks/machine.py: the host line every benchmark prints."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import machine  # noqa: E402

CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx2 fma avx512f amx_int8 avx512_vnni avx512_bf16 amx_tile
bogomips\t: 5199.99

processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx2 fma avx512f amx_int8 avx512_vnni avx512_bf16 amx_tile
"""


def test_cpu_flags_reads_the_model_and_the_relevant_flags_in_a_fixed_order():
    model, flags = machine.cpu_flags(CPUINFO)
    assert model == "Intel(R) Xeon(R) Processor"
    # the FLAGS order, not the file's; flags outside FLAGS (fpu, sse2, amx_tile) left out
    assert flags == "avx2 fma avx512f avx512_vnni avx512_bf16 amx_int8"


def test_cpu_flags_of_an_avx2_host_names_no_vnni():
    _, flags = machine.cpu_flags("model name : Old CPU\nflags : sse2 avx avx2 fma\n")
    assert flags == "avx2 fma"


def test_describe_names_the_cpu_its_flags_and_the_usable_cores(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    line = machine.describe(path)
    assert line.startswith("CPU: Intel(R) Xeon(R) Processor; ISA: avx2 fma avx512f")
    assert line.endswith(f"{machine.usable_cores()} usable cores")


def test_describe_without_cpuinfo_says_unknown(tmp_path):
    assert "ISA: unknown" in machine.describe(tmp_path / "missing")


def test_describe_of_a_cpu_with_none_of_the_flags_says_so(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("model name : Tiny\nflags : fpu sse2\n")
    assert "ISA: none of avx2/" in machine.describe(path)
