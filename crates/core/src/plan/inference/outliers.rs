//! LLM.int8's outlier columns (bitsandbytes 0.50.2 `MatMul8bitLt`: input columns holding an
//! element at or above the threshold take the fp16 path): how many a projection's input
//! has, as a plan assumes it ([`Int8Outliers`]). Used by [`super::quant`]'s `Linear8bitLt`
//! and carried by every forward's [`super::linear::Call`].

use serde::Serialize;

/// LLM.int8's threshold (`BitsAndBytesConfig.llm_int8_threshold`, 6.0): input elements at
/// or above it in magnitude make their column an outlier column.
const INT8_THRESHOLD: f64 = 6.0;

/// transformers' `PretrainedConfig.initializer_range` default (the Llama lineage's configs
/// keep it): the std of `_init_weights`' normal linear weights.
pub const DEFAULT_INITIALIZER_RANGE: f64 = 0.02;

/// How many input columns of an LLM.int8 projection hold an element at or above the
/// threshold: data, not architecture.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub enum Int8Outliers {
    /// None (every projection takes the int8 path alone): the plan for trained checkpoints,
    /// whose outliers sit in a handful of feature dimensions (Dettmers et al. 2022).
    #[default]
    None,
    /// A checkpoint of random weights as `from_config` initialises them (`_init_weights`:
    /// every linear weight N(0, `std`²), transformers' `initializer_range`): the RMS-normed
    /// inputs (≈ N(0, 1)) practically never reach 6, but the MLP's `down_proj` input
    /// `act(gate) · up` is a product of two N(0, `std`² · hidden) projections; each element
    /// reaches the threshold with probability `p` ([`down_proj_tail`]), and over `m` rows a
    /// column holds one with `1 − (1 − p)^m` (the expected count is planned).
    RandomInit { std: f64 },
}

impl Int8Outliers {
    /// Expected outlier columns of a `down_proj` input of `k` columns over `m` rows, in a
    /// decoder of `hidden` features (`gelu`: Gemma's tanh GELU, else SiLU).
    pub fn down_proj_columns(self, hidden: u64, gelu: bool, m: u64, k: u64) -> u64 {
        let Int8Outliers::RandomInit { std } = self else {
            return 0;
        };
        let p = down_proj_tail(std * (hidden as f64).sqrt(), gelu);
        let any = 1.0 - (1.0 - p).powf(m as f64);
        let cols = (k as f64 * any).round();
        if cols.is_finite() && cols > 0.0 {
            (cols as u64).min(k)
        } else {
            0
        }
    }
}

/// `P(|act(g) · u| ≥ 6)` for independent `g`, `u` ~ N(0, `s`²): the integral over `g` of its
/// density times `P(|u| ≥ 6 / |act(g)|) = erfc(6 / (|act(g)| s √2))` (Simpson's rule over
/// ±12 s).
pub fn down_proj_tail(s: f64, gelu: bool) -> f64 {
    if s <= 0.0 || !s.is_finite() {
        return 0.0;
    }
    let act = |g: f64| {
        if gelu {
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044_715 * g.powi(3));
            0.5 * g * (1.0 + inner.tanh())
        } else {
            g / (1.0 + (-g).exp())
        }
    };
    let f = |g: f64| {
        let density = (-0.5 * (g / s).powi(2)).exp() / (s * (2.0 * std::f64::consts::PI).sqrt());
        let a = act(g).abs();
        if a == 0.0 {
            return 0.0;
        }
        density * erfc(INT8_THRESHOLD / (a * s * std::f64::consts::SQRT_2))
    };
    let n = 6000;
    let (lo, hi) = (-12.0 * s, 12.0 * s);
    let h = (hi - lo) / f64::from(n);
    let mut sum = f(lo) + f(hi);
    for i in 1..n {
        let w = if i % 2 == 1 { 4.0 } else { 2.0 };
        sum += w * f(lo + h * f64::from(i));
    }
    (sum * h / 3.0).clamp(0.0, 1.0)
}

/// The complementary error function (Numerical Recipes' `erfcc`, relative error < 1.2e-7).
pub(super) fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let c = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ];
    let poly = c.iter().rev().fold(0.0, |acc, &k| acc * t + k);
    let r = t * (-z * z + poly).exp();
    if x >= 0.0 { r } else { 2.0 - r }
}
