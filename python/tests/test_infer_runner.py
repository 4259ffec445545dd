"""The inference runner shipped in the binary (`crates/device/runners/infer_runner.py`, issue
29: `vramlab bench --engine torch --step generate|prefill`) on the CPU, in a fresh process as
the bench starts it: `serve --device cpu` answers the bench engine's protocol (a ready line,
then one reply per config line: a config.json object, a vramlab preset, a refused row), and
the lab's entry point `lab/device/infer_runner.py` runs the same code on a config file. No
memory figures on the CPU (the GPU measures them). Skipped where torch or transformers are not
installed (.ci/python.sh installs both where PyTorch's CPU index is reachable)."""

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# A 2-layer random Llama (GQA: 4 query heads, 2 KV heads).
TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "vocab_size": 1000, "max_position_embeddings": 256, "eos_token_id": 2}
# The same model as a vramlab preset (what the bench sends for a built-in Llama preset).
PRESET = {"id": "tiny-llama", "family": "llama", "display_name": "tiny", "reference": "test",
          "input": {"kind": "tokens", "seq_len": 256},
          "params": {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "max_position_embeddings": 256, "tie_word_embeddings": False,
                     "attention_dropout": 0.0}}


def test_serve_answers_every_config_line(root):
    runner = root / "crates" / "device" / "runners" / "infer_runner.py"
    rows = [
        {"id": "gen", "model": "tiny", "hf_config": TINY, "step": "generate", "batch": 2,
         "prompt": 8, "new_tokens": 3, "precision": "fp32", "attention": "sdpa",
         "kv_cache": "static", "do_sample": True, "top_k": 5},
        {"model": PRESET, "model_id": "tiny-llama", "step": "prefill", "batch": 1, "prompt": 6,
         "precision": "bf16", "attention": "eager"},
        {"model": PRESET, "step": "train", "batch": 1, "prompt": 4, "precision": "bf16"},
    ]
    p = subprocess.run([sys.executable, "-u", str(runner), "serve", "--device", "cpu"],
                       input="".join(json.dumps(r) + "\n" for r in rows), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(lines) == 1 + len(rows), p.stdout
    ready = lines[0]
    assert ready["ready"] is True and ready["pid"] > 0
    assert ready["versions"]["device_name"] == "cpu"
    assert ready["versions"]["transformers"] == transformers.__version__

    gen, pre, refused = lines[1:]
    for reply in (gen, pre):
        assert "error" not in reply, reply
        assert reply["oom"] is False
        assert reply["step_ms"] > 0
        assert "model" not in reply and "hf_config" not in reply  # the reply stays small
    # 2 layers of q/k/v/o and gate/up/down, 2 norms each, the final norm, embeddings, lm_head
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64
    params = 2 * per_layer + 64 + 2 * 1000 * 64
    assert gen["params"] == params
    assert pre["params"] == params
    assert gen["weights_bytes"] > 4 * params - 4096  # fp32
    assert pre["weights_bytes"] < 2 * params + 4096  # bf16
    assert gen["id"] == "gen" and pre["model_id"] == "tiny-llama"
    assert "generate or prefill" in refused["error"]


def test_the_lab_entry_point_runs_the_shipped_runner(root, tmp_path):
    config = tmp_path / "tiny-config.json"
    config.write_text(json.dumps(TINY))
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"id": "t1", "model": str(config), "step": "generate",
                                "batch": 1, "prompt": 5, "new_tokens": 2, "precision": "fp32",
                                "attention": "sdpa"}) + "\n")
    out = tmp_path / "out.jsonl"
    lab = root / "lab" / "device" / "infer_runner.py"
    p = subprocess.run([sys.executable, str(lab), "--configs", str(rows), "--out", str(out),
                        "--device", "cpu"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["id"] == "t1" and row["oom"] is False and "error" not in row, row
    assert row["device_name"] == "cpu" and row["step_s"] >= 0
    # the lab's names stay importable from its entry point (lab/cpu/device_map_reference.py)
    sys.path.insert(0, str(lab.parent))
    try:
        import infer_runner as ir

        assert ir.DTYPES["bf16"] is torch.bfloat16
        assert ir.load_config(str(config)).num_key_value_heads == 2
    finally:
        sys.path.remove(str(lab.parent))
