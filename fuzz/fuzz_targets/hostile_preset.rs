//! Built-in presets with numbers overridden by the fuzzer (any u64, any float): the JSON
//! parser is bypassed so that every input is a parseable model with hostile sizes, and the
//! graph builder and planner see it.
#![no_main]

mod common;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use vramlab::model::Preset;
use vramlab::model::preset::BUILTIN;
use vramlab::plan::config::{AllocatorConfig, MAX_ACCUM, MAX_BATCH};
use vramlab::plan::{Attention, Optimizer, Precision, TrainConfig};

#[derive(Debug, Arbitrary)]
struct Input {
    model: u8,
    /// (which numeric field, new value); floats are taken from the bits.
    overrides: Vec<(u8, u64)>,
    size: Option<u64>,
    batch: u64,
    accum: u64,
    precision: u8,
    optimizer: u8,
    checkpointing: bool,
    eager: bool,
    split: Option<u64>,
}

/// Paths of the numeric leaves of `v`.
fn numbers(v: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        Value::Number(_) => out.push(path.clone()),
        Value::Object(m) => {
            for (k, c) in m {
                path.push(k.clone());
                numbers(c, path, out);
                path.pop();
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                path.push(i.to_string());
                numbers(c, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn leaf<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, k| match v {
        Value::Array(a) => k.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
        other => other.get_mut(k.as_str()),
    })
}

fuzz_target!(|input: Input| {
    let (_, text) = BUILTIN[usize::from(input.model) % BUILTIN.len()];
    let Ok(mut doc) = serde_json::from_str::<Value>(text) else {
        return;
    };
    let mut paths = Vec::new();
    numbers(&doc, &mut Vec::new(), &mut paths);
    if paths.is_empty() {
        return;
    }
    for &(which, value) in input.overrides.iter().take(8) {
        let path = &paths[usize::from(which) % paths.len()];
        if let Some(slot) = leaf(&mut doc, path) {
            *slot = if slot.is_f64() {
                serde_json::json!(f64::from_bits(value))
            } else {
                serde_json::json!(value)
            };
        }
    }
    let Ok(preset) = Preset::from_value(&doc) else {
        return;
    };
    let cfg = TrainConfig {
        // Mostly within the limits, so that the model's numbers are what is hostile.
        batch: input.batch % (MAX_BATCH + 2),
        size: input.size,
        precision: Precision::ALL[usize::from(input.precision) % Precision::ALL.len()],
        optimizer: Optimizer::ALL[usize::from(input.optimizer) % Optimizer::ALL.len()],
        accum: input.accum % (MAX_ACCUM + 2),
        checkpointing: input.checkpointing,
        attention: if input.eager {
            Attention::Eager
        } else {
            Attention::Sdpa
        },
        allocator: AllocatorConfig {
            expandable_segments: false,
            max_split_size_mb: input.split,
        },
    };
    common::plan_small(&preset, &cfg);
});
