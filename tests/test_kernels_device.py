"""Device-agnostic measuring in servelab.kernels: the CPU path named explicitly, unknown devices
refused with one clear error, GPU synchronisation around every timed call (checked on the CPU
with a stand-in for torch.cuda), and the CUDA path itself where a GPU is present."""
import math

import pytest
import torch

from servelab import kernels as K
from servelab.model import LlamaConfig, LlamaModel

GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="no CUDA GPU here; the CPU stays the tested default")


def _tiny():
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    return LlamaModel(cfg).init_weights(seed=0).eval()


MEASUREMENTS = {
    "time_call": lambda d: K.time_call(lambda: None, 1, device=d),
    "op_overhead_seconds": lambda d: K.op_overhead_seconds(repeats=20, device=d),
    "fusion_measurement": lambda d: K.fusion_measurement("swiglu", 4, 8, 1, device=d, compile=False),
    "overlap_measurement": lambda d: K.overlap_measurement(n=8, copy_mb=1, repeats=1, device=d),
}


@pytest.mark.parametrize("name", sorted(MEASUREMENTS))
@pytest.mark.parametrize("device", ["tpu", "gpu", "cuda:x", "cpu:1", "mps"])
def test_unknown_devices_are_refused_with_the_choices(name, device):
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        MEASUREMENTS[name](device)


@pytest.mark.parametrize("name", sorted(MEASUREMENTS))
@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_every_measurement_runs_on_the_cpu_when_asked(name, device):
    out = MEASUREMENTS[name](device)
    if name in ("time_call", "op_overhead_seconds"):
        assert math.isfinite(out) and out > 0
    elif name == "fusion_measurement":
        assert out["eager_s"] > 0
    if name == "overlap_measurement":
        assert out["device"] == "cpu" and out["sum_s"] > 0


@pytest.mark.skipif(GPU, reason="a GPU is present")
@pytest.mark.parametrize("name", sorted(MEASUREMENTS))
def test_cuda_without_a_gpu_says_so(name):
    with pytest.raises(ValueError, match="no CUDA GPU"):
        MEASUREMENTS[name]("cuda")


def test_model_measurements_follow_the_models_device():
    model = _tiny()
    step = K.decode_step(model, batch=2, context=3)
    logits = step()
    assert logits.device.type == "cpu" and logits.shape == (2, 1, 64)
    out = K.step_overhead(model, batch=1, context=3, repeats=2, op_seconds=1e-6)
    assert out["ops"] > 0 and out["step_seconds"] > 0


def test_a_gpu_is_synchronised_before_the_clock_and_after_every_call(monkeypatch):
    """Stand-in torch.cuda: the order of calls and synchronisations is what a GPU would see."""
    events = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(("sync", str(device))))
    K.time_call(lambda: events.append("call"), repeats=2, warmup=1, device="cuda")
    assert events == ["call", ("sync", "cuda"), "call", ("sync", "cuda"), "call", ("sync", "cuda")]
    events.clear()
    K.time_call(lambda: events.append("call"), repeats=1, warmup=0, device="cuda:0")
    assert events == [("sync", "cuda:0"), "call", ("sync", "cuda:0")]
    with pytest.raises(ValueError, match="1 CUDA GPU"):
        K.time_call(lambda: None, 1, device="cuda:3")


@needs_gpu
def test_measurements_on_cuda():
    assert K.op_overhead_seconds(repeats=40, device="cuda") > 0
    fused = K.fusion_measurement("swiglu", 8, 64, 2, device="cuda", compile=False)
    assert fused["eager_s"] > 0
    ov = K.overlap_measurement(n=256, copy_mb=4, repeats=2, device="cuda")
    assert ov["device"].startswith("cuda") and ov["sum_s"] > 0
    model = _tiny().to("cuda")
    assert K.decode_step(model, 1, 3)().device.type == "cuda"
    assert K.step_overhead(model, 1, 3, repeats=2)["step_seconds"] > 0
