//! What each optimizer allocates, mirrored from the implementations (PyTorch's `foreach`
//! optimizers on CUDA, bitsandbytes for the 8-bit ones): the state it creates for a
//! parameter on its first step, and the temporaries its step allocates. The simulator
//! turns these byte counts into events; nothing else in the planner knows optimizers.

use crate::model::ir::Param;

use super::config::Optimizer;
use super::numerics::DType;

/// The state buffers `opt` creates on the GPU for one trainable parameter on its first
/// step, in bytes, in allocation order. `dtype` is the parameter's storage dtype (PyTorch
/// keeps state in the parameter's dtype). Paged state is not here: see [`paged_bytes`].
pub fn state_bytes(opt: Optimizer, p: &Param, dtype: DType) -> StateBytes {
    let bytes = p.elems * dtype.size();
    match opt {
        Optimizer::Sgd => StateBytes::none(),
        Optimizer::SgdMomentum => StateBytes::one(bytes),
        // exp_avg, exp_avg_sq.
        Optimizer::Adam | Optimizer::AdamW => StateBytes::two(bytes, bytes),
        // Factored second moment: a row and a column statistic per matrix.
        Optimizer::Adafactor => match p.matrix {
            Some((r, c)) => StateBytes::two(p.elems / c * dtype.size(), p.elems / r * dtype.size()),
            None => StateBytes::one(bytes),
        },
        Optimizer::Adam8bit
        | Optimizer::AdamW8bit
        | Optimizer::PagedAdamW8bit
        | Optimizer::PagedAdamW => bnb_state(opt, p.elems),
    }
}

/// bitsandbytes 0.50 `Optimizer2State.init_state`: tensors under `min_8bit_size` (4096)
/// elements, and every tensor of the 32-bit optimizer, keep two fp32 states; 8-bit keeps
/// `state1`, `state2` (uint8) and `absmax1`, `absmax2` (fp32, one per 256-element block).
/// The paged optimizers put `state1`/`state2` of tensors of at least 100 000 elements in
/// unified memory (`get_state_buffer` → `get_paged`), not on the caching allocator.
fn bnb_state(opt: Optimizer, n: u64) -> StateBytes {
    let paged = opt.is_paged() && n >= PAGED_MIN_ELEMS;
    let eight = opt != Optimizer::PagedAdamW && n >= MIN_8BIT_SIZE;
    let (state, scales) = if eight {
        (n, 4 * n.div_ceil(256))
    } else {
        (4 * n, 0)
    };
    let state = if paged { 0 } else { state };
    let mut s = StateBytes::none();
    for b in [state, state, scales, scales] {
        if b > 0 {
            s.parts[s.len] = b;
            s.len += 1;
        }
    }
    s
}

/// bitsandbytes' `min_8bit_size`.
pub const MIN_8BIT_SIZE: u64 = 4096;
/// Tensors with at least this many elements get paged state (`get_state_buffer`).
pub const PAGED_MIN_ELEMS: u64 = 100_000;

/// Bytes of `opt`'s state for one parameter that live in unified memory (paged): outside
/// PyTorch's caching allocator, so not in `torch.cuda.memory_allocated()`; the driver
/// evicts them to host memory under pressure.
pub fn paged_bytes(opt: Optimizer, p: &Param) -> u64 {
    if !opt.is_paged() || p.elems < PAGED_MIN_ELEMS {
        return 0;
    }
    let per = if opt == Optimizer::PagedAdamW { 4 } else { 1 };
    2 * per * p.elems
}

/// Up to four state buffers of one parameter (bytes, in allocation order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateBytes {
    parts: [u64; 4],
    len: usize,
}

impl StateBytes {
    fn none() -> StateBytes {
        StateBytes {
            parts: [0; 4],
            len: 0,
        }
    }

    fn one(a: u64) -> StateBytes {
        StateBytes {
            parts: [a, 0, 0, 0],
            len: 1,
        }
    }

    fn two(a: u64, b: u64) -> StateBytes {
        StateBytes {
            parts: [a, b, 0, 0],
            len: 2,
        }
    }

    /// The buffers' sizes, in allocation order.
    pub fn parts(&self) -> &[u64] {
        &self.parts[..self.len]
    }

    /// Their sum.
    pub fn total(&self) -> u64 {
        self.parts().iter().sum()
    }
}

/// Which parameters' temporaries one wave of the step allocates together (they are all
/// freed before the next wave).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wave {
    /// One parameter-sized temporary for every parameter (`_foreach_*` results).
    All,
    /// One for every matrix parameter.
    Matrices,
    /// One for every vector parameter.
    Vectors,
}

/// The waves of parameter-sized temporaries `opt`'s step allocates, in order.
pub fn step_waves(opt: Optimizer) -> &'static [Wave] {
    match opt {
        // The foreach step's `exp_avg_sq.sqrt()` results, one per parameter at once.
        Optimizer::Adam | Optimizer::AdamW => &[Wave::All],
        // Matrices: the `row_var @ col_var` estimates at once; vectors: grads² and then
        // clones of the variances.
        Optimizer::Adafactor => &[Wave::Matrices, Wave::Vectors],
        // bitsandbytes' fused update kernels allocate nothing.
        Optimizer::Sgd
        | Optimizer::SgdMomentum
        | Optimizer::Adam8bit
        | Optimizer::AdamW8bit
        | Optimizer::PagedAdamW8bit
        | Optimizer::PagedAdamW => &[],
    }
}

impl Wave {
    /// Whether parameter `p` takes a temporary in this wave.
    pub fn includes(self, p: &Param) -> bool {
        match self {
            Wave::All => true,
            Wave::Matrices => p.matrix.is_some(),
            Wave::Vectors => p.matrix.is_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(r: u64, c: u64) -> Param {
        Param {
            elems: r * c,
            matrix: Some((r, c)),
        }
    }

    #[test]
    fn state_bytes_per_optimizer() {
        let w = matrix(1024, 4096);
        let fp32 = DType::F32;
        let n = w.elems;
        assert_eq!(state_bytes(Optimizer::Sgd, &w, fp32).total(), 0);
        assert_eq!(state_bytes(Optimizer::SgdMomentum, &w, fp32).total(), 4 * n);
        assert_eq!(
            state_bytes(Optimizer::AdamW, &w, fp32).parts(),
            &[4 * n, 4 * n]
        );
        assert_eq!(
            state_bytes(Optimizer::Adafactor, &w, fp32).parts(),
            &[4 * 1024, 4 * 4096]
        );
        // 8-bit: two bytes per element plus two fp32 scales per 256 elements.
        assert_eq!(
            state_bytes(Optimizer::Adam8bit, &w, fp32).parts(),
            &[n, n, 4 * n / 256, 4 * n / 256]
        );
        // Paged: only the scales stay on the GPU; small tensors are not paged.
        assert_eq!(
            state_bytes(Optimizer::PagedAdamW8bit, &w, fp32).parts(),
            &[4 * n / 256, 4 * n / 256]
        );
        assert_eq!(paged_bytes(Optimizer::PagedAdamW8bit, &w), 2 * n);
        assert_eq!(paged_bytes(Optimizer::PagedAdamW, &w), 8 * n);
        assert_eq!(state_bytes(Optimizer::PagedAdamW, &w, fp32).total(), 0);
        let mid = matrix(64, 1024);
        assert_eq!(paged_bytes(Optimizer::PagedAdamW, &mid), 0);
        assert_eq!(
            state_bytes(Optimizer::PagedAdamW, &mid, fp32).total(),
            8 * 64 * 1024
        );
        let small = Param {
            elems: 100,
            matrix: None,
        };
        assert_eq!(state_bytes(Optimizer::Adam8bit, &small, fp32).total(), 800);
        assert_eq!(
            state_bytes(Optimizer::Adam, &small, DType::BF16).total(),
            400
        );
    }

    #[test]
    fn step_waves_cover_the_foreach_temporaries() {
        let (w, b) = (
            matrix(8, 8),
            Param {
                elems: 8,
                matrix: None,
            },
        );
        assert_eq!(step_waves(Optimizer::AdamW), &[Wave::All]);
        assert!(step_waves(Optimizer::Sgd).is_empty());
        let waves = step_waves(Optimizer::Adafactor);
        assert!(waves[0].includes(&w) && !waves[0].includes(&b));
        assert!(waves[1].includes(&b) && !waves[1].includes(&w));
    }
}
