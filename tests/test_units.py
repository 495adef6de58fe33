"""tracekit.model.units and tracekit.model.parts: the one copy of the formatters and of the part
names that every table, sentence and report prints through."""

from __future__ import annotations

import math

from tracekit.model import parts, units


def test_formatters_print_the_table_and_report_forms():
    assert units.ms(12_345_678) == "12.346" and units.ms(12_345_678, unit=True, missing="n/a") == "12.346 ms"
    assert units.ms(-1_500_000, sign=True) == "-1.500" and units.ms(1_500_000, sign=True) == "+1.500"
    assert units.us(12_340) == "12.3" and units.us(1_250, sign=True, unit=True) == "+1.2 us"
    assert (
        units.pct(0.25) == "25.0%" and units.pct(0.005, 0) == "0%" and units.pct(0.031, sign=True) == "+3.1%"
    )
    assert units.times(1.374) == "1.37x"
    assert units.ms_or_us(123_456) == "0.12 ms" and units.ms_or_us(45_600) == "45.6 us"
    assert units.ms_or_us_signed(-45_600) == "-45.6 us" and units.ms_or_us_signed(2_000_000) == "+2.00 ms"


def test_a_missing_or_non_finite_number_prints_as_missing():
    for f in (units.ms, units.us, units.pct, units.times):
        assert f(None) == "-" and f(math.nan) == "-" and f(math.inf, missing="n/a") == "n/a"
    assert units.ms(0) == "0.000" and units.pct(0.0) == "0.0%"  # zero is a number, not missing


def test_the_parts_and_the_words():
    assert len(parts.PARTS) == 6 and parts.PARTS[0] == "compute" and parts.PARTS[-1] == "idle"
    assert set(parts.COORDINATION) <= set(parts.LEAF_PARTS) and "collective" not in parts.LEAF_PARTS
    assert parts.MAIN_TERMS == ("compute", "memory", "transfer", "coordination")
    assert set(parts.TERM_WORDS) == set(parts.TERMS)
    gpu, cpu = parts.term_words("gpu"), parts.term_words("host")
    assert "link" in gpu["transfer"] and cpu["transfer"] == parts.CPU_TRANSFER_WORDS
    assert {k: v for k, v in cpu.items() if k != "transfer"} == {
        k: v for k, v in gpu.items() if k != "transfer"
    }
    parts.term_words("gpu")["compute"] = "changed"  # a copy each time: the defaults stay
    assert parts.TERM_WORDS["compute"] != "changed"
