//! One-sentence explanations shown as tooltips.

pub const ALLOCATED: &str = "Allocated: bytes held by live tensors, what torch.cuda.max_memory_allocated() reports at the peak of the step.";
pub const RESERVED: &str = "Reserved: memory PyTorch's caching allocator has taken from the driver (torch.cuda.max_memory_reserved()); it is larger than allocated because blocks are rounded up and freed blocks stay cached in segments for reuse, which fragments them.";
pub const NVIDIA_SMI: &str = "nvidia-smi: what the driver shows for the process, reserved memory plus the CUDA context; this is what must fit on the GPU.";
pub const ERROR_BAND: &str = "Measured error band: how far planned peaks have been from PyTorch's measured peaks for this mode (model family × fine-tuning mode × strategy) over every measured row in tests/data, computed by code (presets/error_bands.json). The verdict, the largest batch and the fit search use the upper edge of the reserved band. A mode nobody measured gets a wider band.";
pub const CUDA_CONTEXT: &str = "CUDA context: a fixed per-process cost (driver state, kernels, cuBLAS/cuDNN handles) that PyTorch never reports but nvidia-smi does.";
pub const ALLOCATOR_OVERHEAD: &str = "Allocator overhead: reserved − allocated, memory cached by the allocator but not holding a tensor at the peak (rounding and fragmentation); expandable_segments shrinks it.";
pub const ACCUMULATION: &str = "Gradient accumulation runs several micro-batches before each optimizer step: memory follows the micro-batch (plus one set of gradients), while the effective batch is micro-batch × steps.";
pub const BATCH: &str =
    "Micro-batch size: samples in one forward/backward pass; activations grow linearly with it.";
/// Activation checkpointing: its cost in the core's words (`timing::checkpointing_cost`).
pub fn checkpointing() -> String {
    format!(
        "Activation checkpointing keeps only each block's input: much less activation memory; {}.",
        vramlab_core::plan::timing::checkpointing_cost(None)
    )
}
pub const ATTENTION: &str = "Eager attention stores the seq × seq attention probabilities for backward; SDPA (flash / memory-efficient kernels) does not.";
pub const LOOP: &str = "plain: `out = model(x); loss = criterion(out, y); loss.backward()` keeps the output (logits) alive through backward · trainer: `loss = model(**batch).loss` (HF Trainer) frees it before backward · lightning: the same, and Lightning zeroes the gradients only after the forward, so they live through it.";
pub const STEP: &str = "train: forward, backward and optimizer step · eval: a validation forward under `torch.no_grad()` after training (weights, gradients and optimizer state stay) · eval-grad: the same without `no_grad`, so autograd keeps every activation until the loss is dropped — the classic validation OOM.";
pub const EXPANDABLE: &str = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets segments grow in place instead of caching many fixed-size ones, which removes most fragmentation.";
pub const PRECISION: &str = "FP32 keeps everything in float32; AMP autocasts matmuls to fp16/bf16 (weights stay fp32, activations shrink); pure BF16 stores weights, gradients and optimizer state in bf16.";
pub const OPTIMIZER: &str = "Adam/AdamW keep two fp32 states per parameter, SGD with momentum one, plain SGD none; 8-bit Adam stores its states in one byte each.";
pub const MARGIN: &str = "Safety margin: the share of the GPU kept free for other processes, the display and allocator surprises; the verdict compares against capacity minus this margin.";
pub const FREE_MEMORY: &str = "Plan against the memory free right now (other processes already use the rest) instead of the whole device.";
pub const MAX_BATCH: &str =
    "The largest micro-batch whose predicted nvidia-smi figure stays within the usable capacity.";
pub const PEAK_PHASE: &str = "Where in the training step memory peaks: forward (activations piling up), backward (gradients appearing while activations are still held) or the optimizer step (its state and temporaries).";
pub const SIZE: &str = "Sequence length (tokens per sample) or image side in pixels; activations grow with it (attention with seq² when eager).";
pub const TARGET_SEQ: &str = "Encoder-decoder (T5): the target (decoder) length in tokens; the sequence length above is the source. vramlab plan --target-seq N.";
pub const MOE_IMBALANCE: &str = "Mixture of experts: worst-case routing imbalance F >= 1 (the busiest expert gets F x its share). transformers' default grouped_mm experts use the same memory whatever the routing: 1 is exact for them.";
pub const HUB_MODEL: &str = "Read the model's config.json as `vramlab plan --model` does: a Hub id from your Hugging Face cache (HF_HOME / HF_HUB_CACHE) without a request, else downloaded from HF_ENDPOINT into that cache (HF_TOKEN for gated repositories; nothing is fetched with HF_HUB_OFFLINE=1); a folder from its config.json and its safetensors headers.";
pub const CUSTOM: &str = "Edit the builder parameters of the selected preset; any change makes a custom model named \"custom\" that you can save as a preset file.";
pub const FINETUNE: &str = "full: every parameter trains (gradients and optimizer state for all) · lora: peft LoRA adapters (fp32) train on a frozen base; frozen layers keep no gradient, no optimizer state and save for backward only what the adapters' gradients need.";
pub const FREEZE_EMBEDDINGS: &str = "Full fine-tuning with every nn.Embedding frozen (requires_grad_(False): token, position and type tables, so a tied output head too): no gradient and no optimizer state for them.";
pub const FREEZE_BLOCKS: &str = "Full fine-tuning with the first N blocks (layers) frozen: no gradient, no optimizer state, and backward stops below the first trainable block. 0 freezes none.";
pub const LORA_RANK: &str =
    "LoRA rank r: each adapted layer gets r × (in + out) trainable parameters.";
pub const LORA_DROPOUT: &str = "LoRA dropout p (peft's lora_dropout): above 0 each adapted layer runs its own nn.Dropout on the adapter input, which keeps a copy of that input and a 1-byte mask per element until backward.";
pub const LORA_TARGETS: &str = "attn: peft's default targets (GPT-2 c_attn, Llama q_proj and v_proj) · all-linear: every linear layer but the output layer.";
