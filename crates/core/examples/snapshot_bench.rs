//! Issue 32's snapshot benchmark: opening a memory snapshot the way `vramlab doctor
//! --snapshot FILE` and the GUI's Doctor tab open it (read, type, replay), with the reader
//! before issue 32 (`doctor::legacy`) and the current one side by side in one run,
//! alternated, in-process and as whole processes; it checks that both give the same report.
//!
//! ```sh
//! lab/cpu/bench_snapshot.sh            # writes a 150 MB snapshot, builds, runs this
//! cargo run --release -p vramlab-core --example snapshot_bench -- FILE [--reps N] [--vramlab BIN]
//! ```
//!
//! `--vramlab BIN` also times `BIN doctor --snapshot FILE --json` as a process.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use vramlab_core::answer::doctor_report::{DoctorReport, load_snapshot};
use vramlab_core::doctor::{self, SnapshotReport, pickle};
use vramlab_core::fsutil::{FileKind, open_bounded};

/// Seconds of the phases of one opening.
#[derive(Default, Clone, Copy)]
struct Phases {
    unpickle: f64,
    typing: f64,
    analysis: f64,
}

/// Reads and analyses with the reader before issue 32 (its phases timed apart).
fn open_legacy(path: &Path) -> Result<(SnapshotReport, Phases)> {
    let (file, _) = open_bounded(path, FileKind::Snapshot)?;
    let t = Instant::now();
    let snap = doctor::legacy::read_snapshot_legacy(file, &mut |_| true)?;
    let read = t.elapsed().as_secs_f64();
    let r = doctor::analyze(&snap, None)?;
    let all = t.elapsed().as_secs_f64();
    Ok((
        r,
        Phases {
            unpickle: read,
            typing: 0.0,
            analysis: all - read,
        },
    ))
}

/// Reads and analyses with the current reader, its phases timed apart.
fn open_phases(path: &Path) -> Result<(SnapshotReport, Phases)> {
    let (file, _) = open_bounded(path, FileKind::Snapshot)?;
    let t = Instant::now();
    let p = pickle::read_pickle(file, pickle::Limits::default(), &mut |_| true)?;
    let read = t.elapsed().as_secs_f64();
    let s = doctor::Snapshot::from_pickle(&p)?;
    drop(p);
    let typed = t.elapsed().as_secs_f64();
    let r = doctor::analyze(&s, None)?;
    let all = t.elapsed().as_secs_f64();
    Ok((
        r,
        Phases {
            unpickle: read,
            typing: typed - read,
            analysis: all - typed,
        },
    ))
}

/// CPU seconds (user + system) of this process and of its waited-for children, from
/// `/proc/self/stat` (Linux, USER_HZ 100); `None` elsewhere.
fn cpu_seconds() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|v| v.parse().ok())
        .collect();
    (f.len() == 4).then(|| ((f[0] + f[1]) / 100.0, (f[2] + f[3]) / 100.0))
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Wall and CPU seconds of repeated runs.
#[derive(Default)]
struct Timing {
    wall: Vec<f64>,
    cpu: Vec<f64>,
}

impl Timing {
    fn time(&mut self, children: bool, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let c0 = cpu_seconds();
        let w = Instant::now();
        f()?;
        self.wall.push(w.elapsed().as_secs_f64());
        if let (Some(a), Some(b)) = (c0, cpu_seconds()) {
            self.cpu.push(if children { b.1 - a.1 } else { b.0 - a.0 });
        }
        Ok(())
    }

    fn show(&self) -> String {
        format!(
            "{:6.2} s ({:5.2} CPU)",
            median(&self.wall),
            median(&self.cpu)
        )
    }
}

fn process(program: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .output()
        .with_context(|| format!("running {}", program.display()))?;
    if !out.status.success() {
        bail!(
            "{} {}: {}",
            program.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut file = None;
    let mut reps = 5usize;
    let mut once = None;
    let mut vramlab = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--reps" => reps = it.next().context("--reps N")?.parse().context("--reps")?,
            "--once" => once = Some(it.next().context("--once new|legacy")?.clone()),
            "--vramlab" => vramlab = Some(it.next().context("--vramlab BIN")?.clone()),
            f if file.is_none() && !f.starts_with("--") => file = Some(f.to_string()),
            other => bail!("unknown argument `{other}` (FILE [--reps N] [--vramlab BIN])"),
        }
    }
    let file = file.context("usage: snapshot_bench FILE [--reps N] [--vramlab BIN]")?;
    let path = Path::new(&file);
    if let Some(kind) = once {
        // One opening as its own process, printing what `doctor --json` prints.
        let r = match kind.as_str() {
            "new" => load_snapshot(path, None, &mut |_, _| true)?,
            "legacy" => open_legacy(path)?.0,
            other => bail!("--once: `{other}` is not a reader; use new or legacy"),
        };
        let report = DoctorReport::new(None, Some(r), None).without_timelines();
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    let bytes = std::fs::metadata(path).with_context(|| file.clone())?.len();
    let reps = reps.max(1);
    let (mut old, mut new) = (Timing::default(), Timing::default());
    let (mut old_phases, mut new_phases) = (Vec::new(), Vec::new());
    let mut reports = (None, None);
    for _ in 0..reps {
        old.time(false, || {
            let (r, ph) = open_legacy(path)?;
            reports.0 = Some(r);
            old_phases.push(ph);
            Ok(())
        })?;
        new.time(false, || {
            let (r, ph) = open_phases(path)?;
            reports.1 = Some(r);
            new_phases.push(ph);
            Ok(())
        })?;
    }
    let same = match &reports {
        (Some(o), Some(n)) => serde_json::to_string(o)? == serde_json::to_string(n)?,
        _ => false,
    };
    let exe = std::env::current_exe().context("this benchmark's binary")?;
    let (mut old_p, mut new_p, mut doctor_p) =
        (Timing::default(), Timing::default(), Timing::default());
    for _ in 0..reps {
        old_p.time(true, || process(&exe, &[&file, "--once", "legacy"]))?;
        new_p.time(true, || process(&exe, &[&file, "--once", "new"]))?;
        if let Some(bin) = &vramlab {
            doctor_p.time(true, || {
                process(Path::new(bin), &["doctor", "--snapshot", &file, "--json"])
            })?;
        }
    }
    let phase = |v: &[Phases], f: fn(&Phases) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    println!(
        "{file}: {:.1} MB, {} trace entries; {reps} repetitions of each, alternated",
        bytes as f64 / 1e6,
        reports.1.as_ref().map_or(0, |r| r.trace_entries)
    );
    println!(
        "reports of both readers identical: {}",
        if same { "yes" } else { "NO" }
    );
    println!("median wall (CPU)           before                after             ratio");
    for (label, o, n) in [
        ("in-process", &old, &new),
        ("whole process", &old_p, &new_p),
    ] {
        println!(
            "{label:<16} {}   {}   {:5.1}x",
            o.show(),
            n.show(),
            median(&o.wall) / median(&n.wall).max(1e-9)
        );
    }
    println!(
        "phases (median wall s): before: read + type {:.2}, replay {:.2}; after: unpickle {:.2}, type {:.2}, replay {:.2}",
        phase(&old_phases, |p| p.unpickle),
        phase(&old_phases, |p| p.analysis),
        phase(&new_phases, |p| p.unpickle),
        phase(&new_phases, |p| p.typing),
        phase(&new_phases, |p| p.analysis),
    );
    if vramlab.is_some() {
        println!("vramlab doctor --snapshot FILE --json: {}", doctor_p.show());
    }
    Ok(())
}
