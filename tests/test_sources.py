"""The registry of published figures: every entry sourced, listed in the references appendix."""
from pathlib import Path

import pytest

from servelab import sources, specs

ROOT = Path(__file__).resolve().parents[1]
APPENDIX = ROOT / "book" / "appendix" / "references.md"


def test_every_entry_has_a_value_unit_title_and_url():
    for key, s in sources.SOURCES.items():
        assert s.key == key and s.what and s.title, key
        assert s.url.startswith("https://"), f"{key}: {s.url}"
        assert isinstance(s.value, float) and s.value > 0, key


def test_lookups_and_clear_errors():
    assert sources.value("vllm_continuous_throughput") == 1900
    assert sources.get("vllm_static_throughput").unit == "tokens/s"
    assert "Anyscale" in sources.cite("vllm_static_throughput")
    with pytest.raises(ValueError, match="known"):
        sources.get("no_such_figure")


def test_the_quoted_pairs_are_the_published_ones():
    ratio = sources.value("vllm_continuous_throughput") / sources.value("vllm_static_throughput")
    assert 23 <= ratio < 24  # the post's "23x"
    assert sources.value("kv_reservation_waste_low") < sources.value("kv_reservation_waste_high")
    assert sources.value("paged_kv_waste") < sources.value("kv_reservation_waste_low")


def test_entries_that_repeat_a_chip_datasheet_agree_with_specs():
    b200, h100 = specs.get_chip("B200"), specs.get_chip("H100")
    assert sources.value("b200_dense_fp8_flops") == b200.flops["fp8"]
    assert sources.value("b200_dense_bf16_flops") == b200.flops["bf16"]
    assert sources.value("b200_hbm_bandwidth") == b200.hbm_bandwidth
    assert sources.value("b200_usable_memory") == b200.usable_memory_bytes
    assert sources.value("nvlink5_bandwidth") == b200.interconnect_bandwidth
    assert sources.value("nvlink4_bandwidth") == h100.interconnect_bandwidth


def test_listed_memory_is_close_to_binary_gigabytes():
    """The driver reports about the listed figure in GiB: 6-7% more bytes than read as GB."""
    mib, gib = 2**20, 2**30
    for key, listed in (("h100_driver_memory_mib", specs.get_chip("H100").memory_bytes),
                        ("b200_driver_memory_mib", specs.get_chip("B200").usable_memory_bytes)):
        driver = sources.value(key) * mib
        assert abs(driver / (listed / 1e9 * gib) - 1) < 0.01, key
        assert 1.06 < driver / listed < 1.08, key


def test_references_list_each_work_once_and_cover_every_key():
    refs = sources.references()
    assert len({r.url for r in refs}) == len(refs)
    assert sorted(k for r in refs for k in r.keys) == sorted(sources.SOURCES)


def test_the_appendix_lists_every_source_and_is_current():
    text = APPENDIX.read_text()
    for s in sources.SOURCES.values():
        assert s.url in text, f"{s.key}: its source {s.url} is missing from {APPENDIX.name}"
    block = text.split("<!-- sources:begin -->\n", 1)[1].split("<!-- sources:end -->", 1)[0]
    assert block == sources.references_markdown(), (
        "the generated block in references.md is stale: paste sources.references_markdown() between "
        "the sources:begin/end markers")


def test_the_registry_imports_no_heavy_modules():
    import subprocess
    import sys
    code = "import sys, servelab.sources; print('torch' in sys.modules or 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
