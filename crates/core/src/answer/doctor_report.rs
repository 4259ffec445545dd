//! The doctor's report: what `vramlab doctor` found in an OOM message and/or a memory
//! snapshot — the diagnosis with its remedies and figures, the snapshot's analysis, the
//! planner's answer when a model was given, the planned step laid over the trace — computed
//! once for the CLI and the Python bindings. Serialises as `doctor --json`.

use std::path::Path;

use serde::Serialize;

use super::doctor_advice::PlanAdvice;
use super::error::{AnswerError, Ctx};
use crate::doctor::{self, Diagnosis, OomMessage, SnapshotReport};
use crate::units::Bytes;

/// Everything `doctor` found.
#[derive(Debug, Clone, Serialize)]
pub struct DoctorReport {
    /// The cause, or null when nothing failed (a snapshot without an OOM).
    pub diagnosis: Option<&'static str>,
    /// The remedies of the diagnosis, most useful first (also under `details`).
    pub remedies: Vec<doctor::Remedy>,
    /// The figures the diagnosis used (also under `details`).
    pub figures: Option<doctor::Figures>,
    pub details: Option<Diagnosis>,
    pub message: Option<OomMessage>,
    pub peak_allocated_bytes: Option<Bytes>,
    pub peak_reserved_bytes: Option<Bytes>,
    pub snapshot: Option<SnapshotReport>,
    pub plan: Option<PlanAdvice>,
    /// With a snapshot and a model with its batch: the planned step laid over the trace
    /// (peaks aligned) and the two peaks.
    pub planned_overlay: Option<doctor::overlay::PlannedOverlay>,
}

impl DoctorReport {
    /// Diagnoses `message` and `snapshot`, with the planner's answer `plan` (its verdict
    /// added to the diagnosis) and the planned step over the snapshot's trace.
    pub fn new(
        message: Option<OomMessage>,
        snapshot: Option<SnapshotReport>,
        plan: Option<PlanAdvice>,
    ) -> DoctorReport {
        let mut details = doctor::diagnose(message.as_ref(), snapshot.as_ref());
        if let (Some(d), Some(p)) = (details.as_mut(), plan.as_ref()) {
            p.add_verdict_to(d);
        }
        let planned_overlay = match (&snapshot, &plan) {
            (Some(s), Some(p)) => doctor::overlay::overlay(&s.timeline, &p.timeline),
            _ => None,
        };
        DoctorReport {
            diagnosis: details.as_ref().map(|d| d.cause.as_str()),
            remedies: details
                .as_ref()
                .map(|d| d.remedies.clone())
                .unwrap_or_default(),
            figures: details.as_ref().map(|d| d.figures.clone()),
            peak_allocated_bytes: snapshot.as_ref().map(|s| s.peak_allocated_bytes),
            peak_reserved_bytes: snapshot.as_ref().map(|s| s.peak_reserved_bytes),
            details,
            message,
            snapshot,
            plan,
            planned_overlay,
        }
    }

    /// Drops the timelines (`doctor --json` without `--timeline`).
    pub fn without_timelines(mut self) -> DoctorReport {
        if let Some(s) = self.snapshot.as_mut() {
            s.timeline.clear();
        }
        if let Some(o) = self.planned_overlay.as_mut() {
            o.points.clear();
        }
        self
    }
}

/// An OOM message read from its text (the whole traceback is fine).
pub fn parse_message(text: &str) -> Result<OomMessage, AnswerError> {
    doctor::parse_message(text)
        .ok_or(doctor::DoctorError::NoMessage)
        .plain()
}

/// Reads and analyses a `torch.cuda.memory._dump_snapshot` file; `progress` is told the
/// bytes read of the total (false stops).
pub fn load_snapshot(
    path: &Path,
    device: Option<usize>,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> Result<SnapshotReport, AnswerError> {
    let (file, total) = crate::fsutil::open_bounded(path, crate::fsutil::FileKind::Snapshot)
        .ctx("--snapshot: reading snapshot")?;
    let snap = doctor::read_snapshot(file, &mut |n| progress(n, total))
        .ctx(format!("reading {}", path.display()))?;
    doctor::analyze(&snap, device).plain()
}
