//! How `generate` picks the next token (transformers 5.17 `generation/utils.py`,
//! `GenerationMixin._get_logits_processor` and `_sample`): greedy (`do_sample=False`, the
//! argmax) or multinomial sampling (`do_sample=True`: the logits warpers, then
//! `nn.functional.softmax` and `torch.multinomial`). Beam search (`num_beams > 1`) is planned in
//! `call.rs` (`beam_search`); beam sampling (with `do_sample`) is refused
//! as not modelled yet.

use serde::Serialize;

use crate::plan::PlanError;

/// transformers' default `top_k` (`GenerationConfig._get_default_generation_params`): applied
/// when neither the user nor the model's generation config sets it.
pub const DEFAULT_TOP_K: u64 = 50;

/// The decoding settings of `model.generate()`, as the user passes them (`do_sample`,
/// `temperature`, `top_k`, `top_p`, `num_beams`); unset ones take transformers' defaults
/// (`temperature=1.0`, `top_k=50`, `top_p=1.0`, `num_beams=1`), not the model's
/// `generation_config.json`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Decoding {
    pub do_sample: bool,
    pub temperature: f64,
    pub top_k: u64,
    pub top_p: f64,
    pub num_beams: u64,
}

impl Default for Decoding {
    fn default() -> Self {
        Decoding {
            do_sample: false,
            temperature: 1.0,
            top_k: DEFAULT_TOP_K,
            top_p: 1.0,
            num_beams: 1,
        }
    }
}

/// The logits warpers `_get_logits_processor` adds for sampling, in its order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Warper {
    /// `TemperatureLogitsWarper` (added when `temperature != 1.0`): `scores / temperature`.
    Temperature,
    /// `TopKLogitsWarper` (added when `top_k != 0`), with `min(top_k, vocab)`.
    TopK(u64),
    /// `TopPLogitsWarper` (added when `top_p < 1.0`).
    TopP,
}

impl Decoding {
    /// Greedy search: what every plan before sampling planned.
    pub fn is_greedy(&self) -> bool {
        !self.do_sample && self.num_beams <= 1
    }

    /// Checks the values as transformers does (the warpers' constructors) and refuses what is
    /// not modelled; errors name the field.
    pub fn validate(&self) -> Result<(), PlanError> {
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Err(PlanError::Field {
                field: "temperature",
                reason: format!(
                    "{} is not a strictly positive float (TemperatureLogitsWarper); for greedy \
                     decoding leave out --do-sample",
                    self.temperature
                ),
            });
        }
        if !(self.top_p.is_finite() && self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(PlanError::Field {
                field: "top_p",
                reason: format!(
                    "{} is not in (0, 1] (TopPLogitsWarper); 1.0 keeps every token",
                    self.top_p
                ),
            });
        }
        if self.num_beams == 0 {
            return Err(PlanError::Field {
                field: "num_beams",
                reason: "must be at least 1 (1 = no beam search)".into(),
            });
        }
        if self.num_beams > 1 && self.do_sample {
            return Err(PlanError::Field {
                field: "num_beams",
                reason: format!(
                    "beam sampling (num_beams {} with do_sample) is not modelled yet; plan \
                     beam search (without --do-sample) or sampling (--num-beams 1)",
                    self.num_beams
                ),
            });
        }
        if !self.do_sample
            && (self.temperature != 1.0 || self.top_k != DEFAULT_TOP_K || self.top_p != 1.0)
        {
            return Err(PlanError::Field {
                field: "do_sample",
                reason: "temperature, top_k and top_p are sampling settings (transformers \
                         ignores them in greedy decoding); add --do-sample"
                    .into(),
            });
        }
        Ok(())
    }

    /// The warpers of a sampling call over a vocabulary of `vocab`, in the order
    /// `_get_logits_processor` appends them; none for greedy decoding.
    pub fn warpers(&self, vocab: u64) -> Vec<Warper> {
        let mut w = Vec::new();
        if !self.do_sample {
            return w;
        }
        if self.temperature != 1.0 {
            w.push(Warper::Temperature);
        }
        if self.top_k != 0 {
            w.push(Warper::TopK(self.top_k.min(vocab)));
        }
        if self.top_p < 1.0 {
            w.push(Warper::TopP);
        }
        w
    }

    /// A short description for outputs.
    pub fn describe(&self) -> String {
        if self.is_greedy() {
            return "greedy".into();
        }
        let mut parts = Vec::new();
        if self.top_k != 0 {
            parts.push(format!("top_k {}", self.top_k));
        }
        if self.top_p < 1.0 {
            parts.push(format!("top_p {}", self.top_p));
        }
        if self.temperature != 1.0 {
            parts.push(format!("temperature {}", self.temperature));
        }
        if parts.is_empty() {
            "multinomial sampling".into()
        } else {
            format!("multinomial sampling ({})", parts.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warpers_follow_transformers_conditions() {
        let s = Decoding {
            do_sample: true,
            ..Decoding::default()
        };
        // the defaults: top_k 50 only
        assert_eq!(s.warpers(1000), vec![Warper::TopK(50)]);
        assert_eq!(s.warpers(10), vec![Warper::TopK(10)]);
        let all = Decoding {
            temperature: 0.7,
            top_p: 0.9,
            ..s
        };
        assert_eq!(
            all.warpers(1000),
            vec![Warper::Temperature, Warper::TopK(50), Warper::TopP]
        );
        let none = Decoding { top_k: 0, ..s };
        assert!(none.warpers(1000).is_empty());
        assert!(Decoding::default().warpers(1000).is_empty());
    }

    #[test]
    fn bad_values_and_beams_are_refused_by_name() {
        let s = Decoding {
            do_sample: true,
            ..Decoding::default()
        };
        for (d, field) in [
            (
                Decoding {
                    temperature: 0.0,
                    ..s
                },
                "temperature",
            ),
            (Decoding { top_p: 1.5, ..s }, "top_p"),
            (Decoding { top_p: 0.0, ..s }, "top_p"),
            (Decoding { num_beams: 0, ..s }, "num_beams"),
            (Decoding { num_beams: 4, ..s }, "num_beams"),
            (
                Decoding {
                    top_k: 5,
                    ..Decoding::default()
                },
                "do_sample",
            ),
        ] {
            let e = d.validate().expect_err(field);
            assert!(e.to_string().contains(field), "{e}");
        }
        assert!(s.validate().is_ok());
        assert!(Decoding::default().validate().is_ok());
        // beam search without sampling is planned
        let beams = Decoding {
            num_beams: 2,
            ..Decoding::default()
        };
        assert!(beams.validate().is_ok());
    }
}
