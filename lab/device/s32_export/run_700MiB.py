# vramlab inference plan: model — model.generate(): the prefill (last position's logits) and the decode steps
# batch 2, prompt 256 + 16 new tokens, dynamic KV cache, bf16 weights, sdpa attention, bitsandbytes LLM.int8, device_map="auto"
# planned: peak allocated 819.51 MiB, peak reserved 850.00 MiB (torch.cuda.max_memory_allocated() /
# max_memory_reserved() over the call after a warm-up call), nvidia-smi 1.59 GiB
import psutil  # accelerate's own dependency: the CPU's budget below
import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

MODEL = "lab/device/s32_export/model"  # the model folder this plan is for
BATCH, PROMPT = 2, 256  # input_ids: BATCH sequences of PROMPT tokens
PLANNED_PEAK_ALLOCATED = 859319296  # bytes, 819.51 MiB
PLANNED_PEAK_RESERVED = 891289600  # bytes, 850.00 MiB

cuda = torch.cuda.is_available()
device = "cuda" if cuda else "cpu"
if cuda:
    model = AutoModelForCausalLM.from_pretrained(
        MODEL, dtype=torch.bfloat16, attn_implementation="sdpa",
        quantization_config=BitsAndBytesConfig(load_in_8bit=True, llm_int8_enable_fp32_cpu_offload=True),
        device_map="auto", max_memory={0: "700MiB", "cpu": psutil.virtual_memory().available},
    )
else:
    # bitsandbytes' quantized linears need CUDA: on the CPU the model loads unquantized and whole, not offloaded
    # (a dry run of the script; the plan is for the GPU)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16, attn_implementation="sdpa")
model.eval()

vocab = model.config.get_text_config(decoder=True).vocab_size
gen = torch.Generator(device="cpu").manual_seed(29)
input_ids = torch.randint(0, vocab, (BATCH, PROMPT), generator=gen).to(device)


def call():
    # disable_compile=True: the eager decode step vramlab plans (on CUDA transformers
    # otherwise compiles a static cache's decode step with CUDA graphs)
    out = model.generate(input_ids, max_new_tokens=16, min_new_tokens=16, do_sample=False, disable_compile=True)
    assert out.shape[1] - PROMPT == 16, "generated fewer tokens than planned"


call()  # warm-up: the caching allocator keeps what it reserved, as planned
if cuda:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
call()
gib = 2**30
if cuda:
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    print(f"peak allocated {allocated / gib:.2f} GiB (planned {PLANNED_PEAK_ALLOCATED / gib:.2f} GiB)")
    print(f"peak reserved  {reserved / gib:.2f} GiB (planned {PLANNED_PEAK_RESERVED / gib:.2f} GiB)")
else:
    print(
        f"no CUDA device: the call ran on the CPU; planned on the GPU: peak allocated "
        f"{PLANNED_PEAK_ALLOCATED / gib:.2f} GiB, peak reserved {PLANNED_PEAK_RESERVED / gib:.2f} GiB"
    )
