"""The library's shape (issue 23): no file over 800 lines, and the calculators run without torch."""
import subprocess
import sys
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "lib" / "servelab"
MAX_LINES = 800


def test_no_library_file_is_over_800_lines():
    long = {str(p.relative_to(LIB)): n for p in sorted(LIB.rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these by job (at most {MAX_LINES} lines a file): {long}"


def test_the_torch_free_calculators_run_without_loading_torch():
    """Each is imported by its public path and called in a fresh interpreter; torch must stay unloaded."""
    code = "\n".join([
        "import sys",
        "from servelab.quant import bits_per_weight, memory_bound_step_seconds",
        "from servelab.kernels import bytes_moved, tile_bytes, decode_attention_grid",
        "from servelab import roofline as rl",
        "assert bits_per_weight('int4-g128') == 4.125",
        "assert memory_bound_step_seconds(1e9, 4, 1e12) > 0",
        "assert bytes_moved('swiglu', 1024, 2, fused=True) < bytes_moved('swiglu', 1024, 2)",
        "assert tile_bytes(64, 64, 128)['total'] > 0 and decode_attention_grid(1, 32, 8, 4096)['splits'] >= 1",
        "assert rl.ridge_point('H100') > rl.decode_intensity(1)",
        "assert rl.decode_step_seconds(1e9, 1e5, 8, 1000, 3e12) > 0",
        "assert rl.balance_batch('H100') > 1",
        "print('torch' in sys.modules)",
    ])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "a calculator imported torch"
