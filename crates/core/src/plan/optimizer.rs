//! What each optimizer allocates, mirrored from the implementations (PyTorch's `foreach`
//! optimizers on CUDA, bitsandbytes for the 8-bit ones): the state it creates for a
//! parameter on its first step, and the temporaries its step allocates. The simulator
//! turns these byte counts into events; nothing else in the planner knows optimizers.

use crate::model::ir::Param;

use super::DType;
use super::config::Optimizer;

/// The state buffers `opt` creates for one trainable parameter on its first step, in
/// bytes, in allocation order. `dtype` is the parameter's storage dtype (PyTorch keeps
/// state in the parameter's dtype).
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
        // Two uint8 states plus one fp32 absmax per 2048-element block each, in one
        // allocation; bitsandbytes keeps tensors under 4096 elements in 32-bit.
        Optimizer::Adam8bit => StateBytes::one(if p.elems < 4096 {
            8 * p.elems
        } else {
            2 * p.elems + 2 * 4 * p.elems.div_ceil(2048)
        }),
    }
}

/// Up to two state buffers of one parameter (bytes, in allocation order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateBytes {
    parts: [u64; 2],
    len: usize,
}

impl StateBytes {
    fn none() -> StateBytes {
        StateBytes {
            parts: [0; 2],
            len: 0,
        }
    }

    fn one(a: u64) -> StateBytes {
        StateBytes {
            parts: [a, 0],
            len: 1,
        }
    }

    fn two(a: u64, b: u64) -> StateBytes {
        StateBytes {
            parts: [a, b],
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
        Optimizer::Sgd | Optimizer::SgdMomentum | Optimizer::Adam8bit => &[],
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
        // 8-bit: two bytes per element plus two fp32 scales per 2048 elements.
        assert_eq!(
            state_bytes(Optimizer::Adam8bit, &w, fp32).total(),
            2 * n + 8 * (n / 2048)
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
