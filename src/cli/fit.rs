//! `vramlab fit`: the combinations of remedies that make a configuration fit a GPU, ranked
//! by predicted time per sample (the "make it fit" search of `plan::fit`).

use std::io::Write;
use std::time::Instant;

use anyhow::Result;
use clap::Args;

use vramlab_core::plan::fit::cost::Speed;
use vramlab_core::plan::fit::{FitCandidate, FitReport};
use vramlab_core::plan::gpus::Gpu;
use vramlab_words::fit_words::FitAsk;

use super::args::{self, TrainArgs};

#[derive(Debug, Args)]
pub struct FitArgs {
    #[command(flatten)]
    pub train: TrainArgs,
    /// Micro-batch size you would like to run [default: 1, or the --config file's].
    #[arg(long, allow_negative_numbers = true, value_parser = args::parse_batch)]
    pub batch: Option<u64>,
    /// Samples per optimizer step to keep (micro-batch × accumulation) [default: --batch × --accum].
    #[arg(long, allow_negative_numbers = true, value_parser = args::parse_batch)]
    pub effective_batch: Option<u64>,
    /// Candidates to show at most.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
}

/// The throughput source: the measured profile of the card when `vramlab profile` saved
/// one, else the catalog's datasheet peak.
fn speed(gpu: &Gpu) -> Speed {
    #[cfg(feature = "app")]
    if let Some(p) = vramlab_device::bench::profile::load(&gpu.name) {
        return Speed::measured(p);
    }
    Speed::catalog(gpu)
}

pub fn cmd_fit(a: FitArgs, out: &mut dyn Write) -> Result<()> {
    let (words, _) = a.train.words_loaded()?;
    let t = Instant::now();
    let answer = words.fit_answer(
        FitAsk {
            batch: a.batch,
            effective_batch: a.effective_batch,
            top: a.top,
            speed: &speed,
        },
        &args::detect_gpu,
        &mut args::say,
    )?;
    let search_ms = t.elapsed().as_secs_f64() * 1e3;
    let report = &answer.report;
    if a.train.json {
        writeln!(out, "{}", answer.to_json()?)?;
    } else {
        let gpu = &answer.gpu;
        let card = match answer.config.distributed.world() {
            w if w > 1 => format!(
                "{} ×{w} ({}; memory per GPU)",
                gpu.name,
                answer.config.distributed.strategy.label()
            ),
            _ => gpu.name.clone(),
        };
        write_report(
            out,
            report,
            &answer.preset.id,
            &card,
            answer.budget.usable(),
            search_ms,
        )?;
    }
    if report.candidates.is_empty() {
        return Err(super::exit::Exit {
            code: super::exit::EXIT_NOTHING_FITS,
            message: report
                .reason
                .clone()
                .unwrap_or_else(|| "nothing fits: no combination fits".into()),
        }
        .into());
    }
    Ok(())
}

fn write_report(
    out: &mut dyn Write,
    r: &FitReport,
    model: &str,
    card: &str,
    usable: vramlab_core::units::Bytes,
    search_ms: f64,
) -> Result<()> {
    writeln!(
        out,
        "{model} on {card}: {usable} usable · effective batch {} · step time from the {}",
        r.effective_batch, r.speed_source
    )?;
    writeln!(
        out,
        "searched {} combinations in {search_ms:.0} ms: {} planned, {} pruned (micro-batch 1 \
         cannot fit), {} dominated (a subset of their changes fits, no slower)",
        r.combinations, r.planned, r.pruned_dead, r.dominated
    )?;
    if let Some(reason) = &r.reason {
        writeln!(out, "\n{reason}")?;
        return Ok(());
    }
    writeln!(out)?;
    writeln!(
        out,
        "  #  {:<11} {:>10} {:>10} {:>11} {:>11}  {:>8}  changes",
        "micro×accum", "allocated", "reserved", "nvidia-smi", "ms/sample", "trains"
    )?;
    for (i, c) in r.candidates.iter().enumerate() {
        write_row(out, i + 1, c)?;
    }
    Ok(())
}

fn write_row(out: &mut dyn Write, n: usize, c: &FitCandidate) -> Result<()> {
    writeln!(
        out,
        "  {n:<2} {:<11} {:>10} {:>10} {:>11} {:>11.2}  {:>8}  {}",
        format!("{}×{}", c.micro_batch, c.accum),
        c.peak_allocated.to_string(),
        c.peak_reserved.to_string(),
        c.nvidia_smi.to_string(),
        c.time.ms_per_sample,
        trains(c.trainable_params),
        c.summary()
    )?;
    for cost in &c.costs {
        writeln!(out, "       cost: {cost}")?;
    }
    if c.max_micro_batch > c.micro_batch {
        writeln!(out, "       (micro-batch up to {} fits)", c.max_micro_batch)?;
    }
    Ok(())
}

fn trains(n: u64) -> String {
    match n {
        0..1_000_000 => format!("{:.0}K", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1}M", n as f64 / 1e6),
        _ => format!("{:.2}B", n as f64 / 1e9),
    }
}
