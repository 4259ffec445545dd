//! The allocation events of training steps, as data: buffers (what each holds, its size
//! as `per_sample × batch + fixed` bytes, so one event list serves every batch) and the
//! order they are allocated and freed in. [`super::sim`] generates them; [`super::eval`]
//! evaluates them at a batch size.

use serde::Serialize;

use crate::model::ir::Graph;

/// What a buffer holds (the breakdown categories).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameters,
    Gradients,
    OptimizerState,
    /// fp16/bf16 copies of the weights made by autocast (its weight cache).
    WeightCasts,
    /// Activations: forward outputs and tensors saved for backward, the input batch.
    Activations,
    /// Activation gradients and temporaries (backward working set, optimizer temporaries, cuBLAS workspace).
    Transient,
    /// FSDP2 / ZeRO-3: the gathered (unsharded) parameters and their unsharded gradients of
    /// the units being computed.
    Unsharded,
    /// Collective buffers: all-gather outputs, reduce-scatter inputs, DDP reducer buckets,
    /// ZeRO reduce buckets.
    Communication,
    /// Inference: the key/value cache of `generate` and of a forward with `use_cache`
    /// (transformers' `DynamicCache` / `StaticCache`).
    KvCache,
}

impl Category {
    /// The number of categories (the length of per-category arrays).
    pub const COUNT: usize = 9;

    pub const ALL: [Category; Category::COUNT] = [
        Category::Parameters,
        Category::Gradients,
        Category::OptimizerState,
        Category::WeightCasts,
        Category::Activations,
        Category::Transient,
        Category::Unsharded,
        Category::Communication,
        Category::KvCache,
    ];

    /// The categories only a multi-GPU strategy fills (left out of single-GPU breakdowns).
    pub fn distributed_only(self) -> bool {
        matches!(self, Category::Unsharded | Category::Communication)
    }

    /// The categories only inference fills (left out of training-step breakdowns).
    pub fn inference_only(self) -> bool {
        self == Category::KvCache
    }

    pub fn label(self) -> &'static str {
        match self {
            Category::Parameters => "Parameters",
            Category::Gradients => "Gradients",
            Category::OptimizerState => "Optimizer state",
            Category::WeightCasts => "Low-precision weight copies",
            Category::Activations => "Activations",
            Category::Transient => "Transient / workspace",
            Category::Unsharded => "Unsharded params + grads (FSDP)",
            Category::Communication => "Collective buffers",
            Category::KvCache => "KV cache",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// A phase of the training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Model creation and persistent workspaces (before the measured step).
    Setup,
    /// `zero_grad(set_to_none=True)` at the step's start.
    ZeroGrad,
    Forward,
    Backward,
    /// `optimizer.step()`.
    Optimizer,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::ZeroGrad => "zero_grad",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer step",
        }
    }
}

/// A buffer: one allocation of `per_sample × batch + fixed` bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Buffer {
    pub per_sample: u64,
    pub fixed: u64,
    pub category: Category,
    /// Allocated on a side CUDA stream (FSDP2's all-gather copy-in and reduce-scatter
    /// streams): the caching allocator keeps such blocks in that stream's own pool, where
    /// the default stream's requests cannot reuse them.
    pub side_stream: bool,
}

/// One allocation or free.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event {
    pub buffer: u32,
    pub alloc: bool,
    pub phase: Phase,
    /// Micro-step (0-based) for forward/backward events.
    pub micro: u16,
    /// Node index (for labels), or `u32::MAX`.
    pub node: u32,
}

/// Calibration constants measured on the device (see `tests/data/`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Constants {
    /// Persistent buffers PyTorch allocates through its caching allocator on first use:
    /// one 32 MiB cuBLAS workspace per handle (the forward thread and the autograd thread)
    /// and ~2 MiB of small state. Measured as `allocated_start − params − grads − optimizer
    /// state` = 66 MiB on most rows of tests/data (H200, PyTorch 2.11, CUDA 13).
    pub workspaces: [u64; 3],
}

impl Default for Constants {
    fn default() -> Self {
        Constants {
            workspaces: [32 << 20, 32 << 20, 2 << 20],
        }
    }
}

/// The events of: model creation, one warm-up step (creates optimizer state) and
/// the measured steady-state step, which starts at `measured_start`.
#[derive(Debug, Clone, Default)]
pub struct Events {
    pub buffers: Vec<Buffer>,
    pub events: Vec<Event>,
    pub measured_start: usize,
    /// Whether any buffer is on a side stream (evaluation then runs a second pool).
    pub side_streams: bool,
    /// Whether allocated bytes are the allocator's blocks, as `memory_allocated()` counts
    /// them: a large block cut from a segment whose remainder is 1 MiB or less is not split,
    /// so the remainder counts as allocated (`CUDACachingAllocator.cpp`, `should_split`).
    /// Otherwise the sum of the requests, each rounded to 512 bytes.
    pub whole_blocks: bool,
    /// Event indices before which `torch.cuda.empty_cache()` runs (ascending): the allocator
    /// returns every cached segment without a live block (accelerate's
    /// `set_module_tensor_to_device` calls it after each tensor it copies to the GPU).
    pub empty_cache: Vec<u32>,
    /// [`super::allocator::ExpandableBound::reserved`] of these events replayed at batch 1,
    /// when the generation computed it as it went (generations for expandable segments:
    /// [`super::eval::reserved_bound`] then answers batch 1 without a pass over the events).
    /// A function of `buffers` and `events` alone; `None` where not computed.
    pub(crate) bound_at_one: Option<u64>,
}

impl Events {
    /// Checks that every buffer is allocated once and freed at most once, after its
    /// allocation (a simulation bug otherwise); `g` is the graph the events came from
    /// (for the node names in the message).
    pub fn check(&self, g: &Graph) -> Result<(), String> {
        let mut state = vec![0u8; self.buffers.len()];
        for (i, e) in self.events.iter().enumerate() {
            let s = &mut state[e.buffer as usize];
            match (e.alloc, *s) {
                (true, 0) => *s = 1,
                (false, 1) => *s = 2,
                _ => {
                    return Err(format!(
                        "event {i}: buffer {} {} in state {s} (node {})",
                        e.buffer,
                        if e.alloc { "allocated" } else { "freed" },
                        g.nodes.get(e.node as usize).map_or("-", |n| g.name(n))
                    ));
                }
            }
        }
        Ok(())
    }
}
