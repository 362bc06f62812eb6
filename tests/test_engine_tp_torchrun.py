"""The split engine started by torchrun: the same script on every rank, rank 0 runs the engine.

``torchrun --nnodes 1`` here; the two-machine command differs only in
``--nnodes``, ``--node-rank`` and ``--master-addr`` (chapter 14).
"""
import json
import subprocess
import sys
import textwrap

import pytest

from servelab.engine import LLM
from servelab.model import LlamaConfig, LlamaModel, save_pretrained
from servelab.parallel.launch import free_port
from servelab.sampling import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9], [5, 6, 7, 8, 10, 11], list(range(1, 40))]
KW = dict(num_kv_blocks=16, max_model_len=128, skip_tokenizer_init=True)


def test_torchrun_one_node_gives_the_single_process_tokens(tmp_path):
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    folder = save_pretrained(LlamaModel(cfg).init_weights(std=0.2, seed=5), tmp_path / "m")
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in LLM(folder, **KW).generate(PROMPTS, sp)]
    script = tmp_path / "serve.py"
    script.write_text(textwrap.dedent(f"""
        import json, os
        from servelab.engine import LLM
        from servelab.sampling import SamplingParams
        if __name__ == "__main__":
            llm = LLM({str(folder)!r}, tensor_parallel_size=2, **{KW!r})   # returns on rank 0 only
            outs = llm.generate({PROMPTS!r}, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
            print(json.dumps({{"rank": os.environ["RANK"], "backend": llm.engine.runner.backend,
                              "tokens": [o.outputs[0].token_ids for o in outs]}}), flush=True)
            llm.shutdown()
    """))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as exc:  # pragma: no cover - report, do not hang
        pytest.fail(f"torchrun did not finish: {exc.stderr}")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, out.stdout                  # one engine: rank 0's
    assert lines[0]["rank"] == "0" and lines[0]["backend"] == "torchrun"
    assert lines[0]["tokens"] == want
