//! Runs issue 32's search cases in-process (`vramlab fit` and `vramlab plan` with remedies
//! of `lab/cpu/bench_search.py`, without the process), printing each answer's JSON length
//! and a checksum of it and the median time of `reps` runs, for profiling the planner alone.
//!
//! cargo run --release -p vramlab-words --example search_bench -- 5

use std::time::Instant;

use vramlab_core::plan::fit::cost::Speed;
use vramlab_words::fit_words::FitAsk;
use vramlab_words::train_words::TrainWords;

fn words(model: &str, seq: u64, gpu: &str) -> TrainWords {
    TrainWords {
        model: Some(model.into()),
        seq: Some(seq),
        gpu: Some(gpu.into()),
        ..TrainWords::default()
    }
}

fn checksum(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn fit(model: &str, seq: u64, batch: u64, gpu: &str) -> anyhow::Result<String> {
    let w = words(model, seq, gpu);
    let a = w.fit_answer(
        FitAsk {
            batch: Some(batch),
            effective_batch: None,
            top: 10,
            speed: &Speed::catalog,
        },
        &|| None,
        &mut |_| {},
    )?;
    Ok(a.to_json()?.to_string())
}

fn plan(model: &str, seq: u64, batch: u64, gpu: &str) -> anyhow::Result<String> {
    let w = words(model, seq, gpu);
    let r = w.plan_report(Some(batch), false, false, &|| None, &mut |_| {})?;
    Ok(serde_json::to_string(&r)?)
}

type Case = (&'static str, fn() -> anyhow::Result<String>);

fn main() -> anyhow::Result<()> {
    let reps: usize = std::env::args().nth(1).map_or(Ok(5), |r| r.parse())?;
    let only = std::env::args().nth(2);
    let cases: [Case; 4] = [
        ("fit Llama-3-8B 4090", || {
            fit("Meta-Llama-3-8B", 2048, 4, "rtx-4090")
        }),
        ("plan Llama-3-8B h200", || {
            plan("Meta-Llama-3-8B", 2048, 4, "h200")
        }),
        ("plan Llama-3-8B 4090", || {
            plan("Meta-Llama-3-8B", 2048, 4, "rtx-4090")
        }),
        ("fit gpt2 t4", || fit("gpt2", 1024, 32, "t4")),
    ];
    for (name, f) in cases {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        let mut times = Vec::with_capacity(reps);
        let mut out = String::new();
        for _ in 0..reps {
            let t = Instant::now();
            out = f()?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{name:<22} {:>8.2} ms median ({reps} runs)  {} bytes  checksum {:016x}",
            times[times.len() / 2],
            out.len(),
            checksum(&out)
        );
    }
    Ok(())
}
