"""servelab.comm: the link registry, the alpha-beta model and the running example's bill."""
import math
import subprocess
import sys

import pytest

from servelab import comm
from servelab.specs import get_model


def test_running_example_bill_reproduces_the_guides_figures():
    nv = comm.tensor_parallel_bill("Example-200B", 128, "NVLink H100", latency_s=0)
    assert nv.message_bytes == 128 * 12_288 * 2 == 3_145_728          # "about 3 MB"
    assert nv.count == 160                                              # 2 x 80 layers
    assert 490e6 < nv.total_bytes < 510e6                               # "around 500 MB"
    assert 0.5e-3 < nv.seconds < 0.6e-3                                 # "about half a millisecond"
    net = comm.tensor_parallel_bill("Example-200B", 128, "400G network", latency_s=0)
    assert 9.5e-3 < net.seconds < 10.5e-3                               # "about ten milliseconds"
    assert net.seconds / nv.seconds == pytest.approx(900 / 50)


def test_latency_adds_per_exchange_and_is_reported():
    bill = comm.tensor_parallel_bill("Example-200B", 128, "NVLink H100")
    no_alpha = comm.tensor_parallel_bill("Example-200B", 128, "NVLink H100", latency_s=0)
    assert bill.seconds == pytest.approx(no_alpha.seconds + 160 * comm.NVLINK_LATENCY_S)
    assert bill.latency_share == pytest.approx(160 * comm.NVLINK_LATENCY_S / bill.seconds)
    assert no_alpha.latency_share == 0


def test_ring_all_reduce_formula():
    link = comm.Link("test", bandwidth=100.0, latency_s=1.0)
    # p = 4: 6 steps of alpha, 2 * 3/4 of the bytes
    assert comm.allreduce_seconds(400, link, 4, "ring") == pytest.approx(6 * 1.0 + 1.5 * 400 / 100)
    assert comm.allreduce_seconds(400, link, 4, "simple") == pytest.approx(1.0 + 4.0)
    assert comm.allreduce_seconds(400, link, 1, "ring") == 0.0
    # large p: the ring moves close to twice the message
    big = comm.allreduce_seconds(1e9, link, 1000, "ring", latency_s=0)
    assert big / comm.allreduce_seconds(1e9, link, 1000, "simple", latency_s=0) == pytest.approx(2, rel=1e-2)


def test_all_to_all_formula():
    link = comm.Link("test", bandwidth=10.0, latency_s=0.5)
    # one latency by default, as the simple all-reduce charges
    assert comm.all_to_all_seconds(100, link, 5) == pytest.approx(0.5 + 0.8 * 100 / 10)
    assert comm.all_to_all_seconds(0, link, 5) == comm.allreduce_seconds(0, link, 5)
    # one peer at a time: p - 1 latencies, the same bytes
    assert comm.all_to_all_seconds(100, link, 5, "pairwise") == pytest.approx(4 * 0.5 + 0.8 * 100 / 10)
    assert comm.all_to_all_seconds(100, link, 5, latency_s=0) == pytest.approx(8.0)
    assert comm.all_to_all_seconds(100, link, 1) == 0.0
    with pytest.raises(ValueError, match="pairwise"):
        comm.all_to_all_seconds(100, link, 5, "ring")


def test_links_have_sources_and_domains():
    for link in comm.LINKS.values():
        assert link.source.startswith("NVIDIA") and "http" in link.source, link.name
    nvl72 = comm.get_link("gb200 nvl72")
    assert nvl72.chips == 72 and nvl72.aggregate_bandwidth == pytest.approx(130e12)
    # 72 x 1.8 TB/s = 129.6 TB/s: the per-GPU and combined figures agree
    assert nvl72.chips * nvl72.bandwidth == pytest.approx(nvl72.aggregate_bandwidth, rel=0.01)
    hgx = comm.get_link("HGX H100 8-GPU")
    assert hgx.chips * hgx.bandwidth == pytest.approx(hgx.aggregate_bandwidth)
    assert comm.get_link("400G network").bandwidth == 400e9 / 8   # bits -> bytes
    with pytest.raises(ValueError, match="known links"):
        comm.get_link("carrier pigeon")
    assert comm.get_link(nvl72) is nvl72


@pytest.mark.parametrize("call", [
    lambda: comm.allreduce_message_bytes(0, 10),
    lambda: comm.allreduce_message_bytes(10, 10, 0),
    lambda: comm.allreduces_per_step(0),
    lambda: comm.allreduce_seconds(-1, "NVLink H100"),
    lambda: comm.allreduce_seconds(1, "NVLink H100", 0),
    lambda: comm.allreduce_seconds(1, "NVLink H100", 8, "tree"),
    lambda: comm.bubble_fraction(0, 4),
    lambda: comm.bubble_fraction(4, 0),
    lambda: comm.bubble_fraction(2.5, 4),
    lambda: comm.weight_bytes_per_chip(1e9, 4, "expert"),
    lambda: comm.Link("bad", bandwidth=0, latency_s=0),
    lambda: comm.Link("bad", bandwidth=1, latency_s=-1),
])
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_bubble_fraction():
    assert comm.bubble_fraction(1, 7) == 0
    assert comm.bubble_fraction(4, 1) == pytest.approx(3 / 4)
    assert comm.bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert comm.pipeline_span(4, 8, 0.01) == pytest.approx(0.11)
    # the bubble shrinks towards zero as micro-batches grow
    assert comm.bubble_fraction(8, 1000) < 0.01


def test_tensor_divides_the_bytes_read_in_series_pipeline_does_not():
    t = comm.weight_bytes_per_chip(200e9, 8, "tensor")
    p = comm.weight_bytes_per_chip(200e9, 8, "pipeline")
    assert t["stored"] == p["stored"] == 25e9
    assert t["read_in_series"] == 25e9 and p["read_in_series"] == 200e9


def test_internet_leg_is_a_few_kilobytes():
    assert 1_000 < comm.text_bytes(1000) < 10_000


def test_bill_accepts_hf_dicts():
    cfg = get_model("Llama-3-70B").to_hf_dict()
    bill = comm.tensor_parallel_bill(cfg, 1)
    assert bill.count == 160 and bill.message_bytes == 8192 * 2
    assert math.isclose(bill.as_dict()["total_bytes"], bill.total_bytes)


def test_comm_does_not_import_torch():
    out = subprocess.run([sys.executable, "-c", "import sys, servelab.comm; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_links_agree_with_sources_and_chip_specs():
    from servelab import sources, specs
    assert comm.get_link("NVLink H100").bandwidth == specs.get_chip("H100").interconnect_bandwidth \
        == sources.value("nvlink4_bandwidth")
    nvl = comm.get_link("GB200 NVL72")
    assert nvl.bandwidth == specs.get_chip("B200").interconnect_bandwidth == sources.value("nvlink5_bandwidth")
    assert nvl.aggregate_bandwidth == sources.value("nvl72_nvlink_bandwidth")
    assert nvl.chips == sources.value("nvl72_gpus")


def test_one_way_halves_a_bidirectional_headline_only():
    nv = comm.get_link("NVLink H100")
    assert nv.bidirectional
    half = comm.one_way(nv)
    assert half.bandwidth == nv.bandwidth / 2 and half.latency_s == nv.latency_s
    assert not half.bidirectional and comm.one_way(half) is half
    net = comm.get_link("400G network")
    assert comm.one_way(net) is net                     # a port's rate is already per direction
    nvl = comm.one_way("GB200 NVL72")
    assert nvl.aggregate_bandwidth == comm.get_link("GB200 NVL72").aggregate_bandwidth / 2
    # the simple rule on one direction's bandwidth: the bytes take twice as long
    msg = 3_145_728
    assert comm.allreduce_seconds(msg, half, 8, latency_s=0) == pytest.approx(
        2 * comm.allreduce_seconds(msg, nv, 8, latency_s=0))


def test_nccl_model_matches_tuning_cc():
    # NCCL src/graph/tuning.cc: ring base 6.6 (LL) / 8.4 (Simple) us, 0.6 / 3.4 us per NVLink step,
    # 2(p - 1) steps for an all-reduce; NVLS a flat 25 us.
    assert comm.nccl_allreduce_latency_s(8, "ring-ll") == pytest.approx(15.0e-6)
    assert comm.nccl_allreduce_latency_s(8, "ring-simple") == pytest.approx(56.0e-6)
    assert comm.nccl_allreduce_latency_s(8, "nvls") == pytest.approx(25e-6)
    assert comm.nccl_allreduce_latency_s(1, "nvls") == 0.0
    link = comm.Link("t", bandwidth=100, latency_s=0)
    assert comm.nccl_allreduce_seconds(400, link, 4, "ring-simple") == pytest.approx(
        (8.4 + 6 * 3.4) * 1e-6 + 1.5 * 4)
    assert comm.nccl_allreduce_seconds(400, link, 4, "nvls") == pytest.approx(25e-6 + 4)
    with pytest.raises(ValueError):
        comm.nccl_allreduce_latency_s(8, "tree")


def test_nccl_bill_prices_the_example():
    nv1 = comm.one_way("NVLink H100")
    b = comm.nccl_bill("Example-200B", 128, nv1, schedule="nvls")
    assert b.count == 160
    assert b.seconds == pytest.approx(160 * (25e-6 + b.message_bytes / 450e9))
    assert b.latency_each == pytest.approx(25e-6)
    # the existing simple bill is unchanged
    assert comm.tensor_parallel_bill("Example-200B", 128, "NVLink H100", latency_s=0).seconds == pytest.approx(
        160 * b.message_bytes / 900e9)
