"""`vramlab export --format transformers` (issue 29), run the way a user runs it: a tiny
random Llama saved with `save_pretrained`, the script exported for that folder written to a
file and run with `python` in a fresh process. Without a GPU the script takes its CPU path
(unquantized, not offloaded, the planned GPU peaks printed); on a machine with CUDA it
prints the measured peaks beside the planned ones. Skipped where torch or transformers are
not installed (.ci/python.sh installs both)."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A 2-layer random Llama (GQA: 4 query heads, 2 KV heads) saved as a model folder."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    config = transformers.LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=1000,
    )
    torch.manual_seed(29)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


# (name, the flags after the model's; what the script must contain)
CASES = [
    ("generate-bf16", ["--step", "generate", "--seq", "12", "--new-tokens", "5", "--batch", "2"],
     ["max_new_tokens=5, min_new_tokens=5, do_sample=False", "dtype=torch.bfloat16"]),
    ("generate-static-sampling-fp32-eager",
     ["--step", "generate", "--seq", "8", "--new-tokens", "4", "--kv-cache", "static",
      "--do-sample", "--top-k", "5", "--precision", "fp32", "--attention", "eager"],
     ['cache_implementation="static"', "do_sample=True", "top_k=5", "dtype=torch.float32",
      'attn_implementation="eager"']),
    ("prefill-fp16", ["--step", "prefill", "--seq", "16", "--batch", "3", "--precision", "fp16"],
     ["out = model(input_ids)", "dtype=torch.float16"]),
    ("generate-nf4", ["--step", "generate", "--seq", "8", "--new-tokens", "3", "--quant", "nf4"],
     ['bnb_4bit_quant_type="nf4"', "bnb_4bit_use_double_quant=True"]),
    ("generate-device-map",
     ["--step", "generate", "--seq", "8", "--new-tokens", "3", "--device-map", "auto",
      "--max-gpu-memory", "1MiB", "--max-cpu-memory", "1GiB"],
     ['device_map="auto", max_memory={0: "1MiB", "cpu": "1GiB"}']),
    # without --max-cpu-memory the CPU's budget is written out (accelerate 1.15 puts what
    # GPU 0 cannot hold on the disk when max_memory has no "cpu")
    ("generate-device-map-cpu-default",
     ["--step", "generate", "--seq", "8", "--new-tokens", "3", "--device-map", "auto",
      "--max-gpu-memory", "1MiB"],
     ["import psutil", '"cpu": psutil.virtual_memory().available}']),
]


@pytest.mark.parametrize("name,flags,expected", CASES, ids=[c[0] for c in CASES])
def test_the_exported_script_runs(cli, tiny_llama, tmp_path, name, flags, expected):
    script = tmp_path / f"{name}.py"
    p = subprocess.run(
        [cli, "export", "--format", "transformers", "--model", tiny_llama, *flags,
         "--output", str(script)],
        capture_output=True, text=True,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"wrote {script} (transformers)"
    text = script.read_text()
    assert f"MODEL = {tiny_llama!r}".replace("'", '"') in text, text
    for needle in expected:
        assert needle in text, f"{needle!r} not in the script:\n{text}"
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["CUDA_VISIBLE_DEVICES"] = ""
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=600)
    assert run.returncode == 0, f"the script failed:\n{run.stdout}\n{run.stderr}"
    if torch.cuda.is_available():
        assert "peak allocated" in run.stdout and "(planned" in run.stdout, run.stdout
    else:
        assert "no CUDA device: the call ran on the CPU" in run.stdout, run.stdout
        assert "planned on the GPU: peak allocated" in run.stdout, run.stdout
