//! The Doctor tab: paste or drop an OOM message, open a memory snapshot; shows the
//! diagnosis, the evidence, the remedies, the allocated/reserved timeline and the
//! segment map. The panel returns [`DoctorCommand`]s; snapshots are read on a worker
//! thread that reports progress and stops when the panel drops its receiver.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, TryRecvError, channel};

use egui::{Color32, RichText, Sense, Ui, vec2};
use egui_plot::{HLine, Legend, Line, Plot, PlotPoints};

use vramlab_core::answer::PlanAdvice;
use vramlab_core::doctor::snapshot::SegmentMap;
use vramlab_core::doctor::{self, Diagnosis, OomMessage, SnapshotReport};
use vramlab_core::plan::config::{LoopShape, MAX_BATCH};
use vramlab_core::plan::{Planner, TrainConfig};
use vramlab_core::units::Bytes;

/// Most planned points laid over a snapshot's timeline.
pub const OVERLAY_POINTS: usize = 2000;

/// Every `stride`-th point of the planned timeline, and the peak.
fn thin_timeline(points: &[vramlab_core::plan::TimelinePoint]) -> Vec<(u32, u64)> {
    let stride = points.len().div_ceil(OVERLAY_POINTS).max(1);
    let peak = points
        .iter()
        .enumerate()
        .max_by_key(|(_, p)| p.allocated)
        .map(|(i, _)| i);
    points
        .iter()
        .enumerate()
        .filter(|(i, _)| i % stride == 0 || Some(*i) == peak || *i + 1 == points.len())
        .map(|(_, p)| (p.index, p.allocated.0))
        .collect()
}

/// What the planner says about the Planner tab's current model (the core's doctor advice),
/// shown beside a capacity diagnosis; `None` while it has no answer.
pub fn planner_advice(d: &crate::ui::Derived) -> Option<PlanAdvice> {
    d.answer().map(|a| PlanAdvice::from_report(&a.report))
}

/// The plan of a model the user named for the open snapshot, laid over its timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotPlan {
    pub model: String,
    pub batch: u64,
    pub loop_shape: LoopShape,
    /// Planned allocated timeline of one step (event index, bytes), thinned to at most
    /// [`OVERLAY_POINTS`] points (the peak kept).
    pub planned: Vec<(u32, u64)>,
}

impl SnapshotPlan {
    /// Plans `model` (a preset id or name, forgiving) at `batch` with the default training
    /// settings and `loop_shape`. Errors name the field and, for a model, the closest name.
    pub fn new(model: &str, batch: &str, loop_shape: LoopShape) -> Result<SnapshotPlan, String> {
        let batch: u64 = match batch.trim().parse() {
            Ok(b) if (1..=MAX_BATCH).contains(&b) => b,
            _ => {
                return Err(format!(
                    "Batch: give a whole number from 1 to {MAX_BATCH}, got \"{}\"",
                    batch.trim()
                ));
            }
        };
        let id =
            vramlab_words::vocabulary::model_id(model.trim()).map_err(|e| format!("Model: {e}"))?;
        let preset = vramlab_core::model::preset::find_builtin(id.value)
            .map_err(|e| format!("Model: {e}"))?;
        let cfg = TrainConfig {
            batch,
            loop_shape,
            ..TrainConfig::default()
        };
        let plan = Planner::new(&preset, &cfg)
            .and_then(|p| p.plan(batch))
            .map_err(|e| format!("Plan of {} at batch {batch}: {e}", preset.id))?;
        Ok(SnapshotPlan {
            model: preset.id.clone(),
            batch,
            loop_shape,
            planned: thin_timeline(&plan.timeline),
        })
    }
}

/// What the Doctor panel asks for.
#[must_use]
#[derive(Debug, Clone, PartialEq)]
pub enum DoctorCommand {
    /// Parse the message text and diagnose (with the snapshot, if one is open).
    Diagnose,
    /// Read this snapshot file in the background.
    OpenSnapshot(PathBuf),
    /// Ask the file dialog for a snapshot.
    BrowseSnapshot,
    /// Stop reading the snapshot.
    Cancel,
    /// Forget the message, the snapshot and the diagnosis.
    Clear,
    /// Plan the model named in the panel's model box for the open snapshot.
    PlanModel,
}

enum Loaded {
    Progress(u64, u64),
    Done(Box<Result<SnapshotReport, String>>),
}

struct Loading {
    path: PathBuf,
    read: u64,
    total: u64,
    rx: Receiver<Loaded>,
}

/// The Doctor tab's state (not persisted).
pub struct DoctorPanel {
    /// The message text box.
    pub text: String,
    /// The snapshot path box.
    pub path: String,
    /// The model that ran when the snapshot was recorded (the overlay's model box).
    pub model: String,
    /// Its micro-batch (the overlay's batch box).
    pub batch: String,
    /// Its training-loop shape.
    pub loop_shape: LoopShape,
    message: Option<OomMessage>,
    snapshot: Option<(PathBuf, SnapshotReport)>,
    /// The plan of the model named for this snapshot (cleared with the snapshot).
    named_plan: Option<SnapshotPlan>,
    /// The timeline plot's y range (GiB) as last drawn.
    timeline_y: Option<(f64, f64)>,
    diagnosis: Option<Diagnosis>,
    error: Option<String>,
    loading: Option<Loading>,
    open_dialog: Box<dyn FnMut() -> Option<PathBuf>>,
}

impl Default for DoctorPanel {
    fn default() -> Self {
        DoctorPanel {
            text: String::new(),
            path: String::new(),
            model: String::new(),
            batch: "8".to_string(),
            loop_shape: LoopShape::default(),
            message: None,
            snapshot: None,
            named_plan: None,
            timeline_y: None,
            diagnosis: None,
            error: None,
            loading: None,
            open_dialog: Box::new(|| {
                rfd::FileDialog::new()
                    .set_title("Open a memory snapshot")
                    .add_filter("PyTorch memory snapshot", &["pickle", "pkl"])
                    .pick_file()
            }),
        }
    }
}

impl DoctorPanel {
    /// A panel whose file dialog is `open` (tests).
    pub fn with_dialog(open: Box<dyn FnMut() -> Option<PathBuf>>) -> Self {
        DoctorPanel {
            open_dialog: open,
            ..DoctorPanel::default()
        }
    }

    pub fn diagnosis(&self) -> Option<&Diagnosis> {
        self.diagnosis.as_ref()
    }

    pub fn snapshot(&self) -> Option<&SnapshotReport> {
        self.snapshot.as_ref().map(|s| &s.1)
    }

    pub fn is_loading(&self) -> bool {
        self.loading.is_some()
    }

    /// The plan laid over the snapshot, if the user named a model for it.
    pub fn named_plan(&self) -> Option<&SnapshotPlan> {
        self.named_plan.as_ref()
    }

    /// The timeline plot's y range in GiB, as last drawn.
    pub fn timeline_y_range(&self) -> Option<(f64, f64)> {
        self.timeline_y
    }

    /// Polls the worker, draws, applies the panel's command: what the app calls each frame.
    /// `hint`: the Planner tab's model, shown with a capacity diagnosis.
    pub fn show(&mut self, ui: &mut Ui, hint: Option<&PlanAdvice>) {
        let ctx = ui.ctx().clone();
        self.poll(&ctx);
        self.handle_drops(&ctx);
        let cmd = egui::CentralPanel::default()
            .show(ui, |ui| {
                egui::ScrollArea::vertical()
                    .id_salt("doctor_scroll")
                    .show(ui, |ui| self.ui(ui, hint))
                    .inner
            })
            .inner;
        if let Some(c) = cmd {
            self.apply(c, &ctx);
        }
    }

    /// Applies one command.
    pub fn apply(&mut self, cmd: DoctorCommand, ctx: &egui::Context) {
        match cmd {
            DoctorCommand::Diagnose => self.rediagnose(),
            DoctorCommand::BrowseSnapshot => match (self.open_dialog)() {
                Some(p) => self.apply(DoctorCommand::OpenSnapshot(p), ctx),
                None => {
                    self.error = Some(
                        "No file chosen (cancelled, or no file dialog: type the path instead)."
                            .into(),
                    );
                }
            },
            DoctorCommand::OpenSnapshot(path) => self.start_loading(path, ctx),
            DoctorCommand::Cancel => {
                self.loading = None; // the worker stops at its next progress report
            }
            DoctorCommand::PlanModel => {
                self.error = None;
                match SnapshotPlan::new(&self.model, &self.batch, self.loop_shape) {
                    Ok(p) => self.named_plan = Some(p),
                    Err(e) => {
                        self.named_plan = None;
                        self.error = Some(e);
                    }
                }
            }
            DoctorCommand::Clear => {
                self.text.clear();
                self.path.clear();
                self.message = None;
                self.snapshot = None;
                self.named_plan = None;
                self.timeline_y = None;
                self.diagnosis = None;
                self.error = None;
                self.loading = None;
            }
        }
    }

    fn rediagnose(&mut self) {
        self.error = None;
        self.message = None;
        if !self.text.trim().is_empty() {
            match doctor::parse_message(&self.text) {
                Some(m) => self.message = Some(m),
                None => self.error = Some(doctor::DoctorError::NoMessage.to_string()),
            }
        }
        self.diagnosis = doctor::diagnose(self.message.as_ref(), self.snapshot());
    }

    fn start_loading(&mut self, path: PathBuf, ctx: &egui::Context) {
        let (tx, rx) = channel();
        self.path = path.display().to_string();
        self.error = None;
        self.loading = Some(Loading {
            path: path.clone(),
            read: 0,
            total: 0,
            rx,
        });
        let ctx = ctx.clone();
        std::thread::spawn(move || {
            let progress_tx = tx.clone();
            let repaint = ctx.clone();
            let result = read_and_analyze(&path, &mut |n, total| {
                repaint.request_repaint();
                progress_tx.send(Loaded::Progress(n, total)).is_ok()
            });
            let _ = tx.send(Loaded::Done(Box::new(result))); // the panel may be gone: nothing to tell
            ctx.request_repaint();
        });
    }

    /// Takes the worker's messages.
    pub fn poll(&mut self, ctx: &egui::Context) {
        let Some(l) = self.loading.as_mut() else {
            return;
        };
        loop {
            match l.rx.try_recv() {
                Ok(Loaded::Progress(n, t)) => {
                    l.read = n;
                    l.total = t;
                }
                Ok(Loaded::Done(r)) => {
                    let r = *r;
                    let path = l.path.clone();
                    self.loading = None;
                    match r {
                        Ok(rep) => {
                            // A plan named for the previous snapshot says nothing about this one.
                            self.named_plan = None;
                            self.timeline_y = None;
                            self.snapshot = Some((path, rep));
                            self.rediagnose();
                        }
                        Err(e) => self.error = Some(e),
                    }
                    ctx.request_repaint();
                    return;
                }
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.loading = None;
                    self.error = Some("the snapshot reader stopped unexpectedly".into());
                    return;
                }
            }
        }
    }

    /// A dropped `.pickle` opens as a snapshot; a dropped text file becomes the message.
    fn handle_drops(&mut self, ctx: &egui::Context) {
        let dropped = ctx.input(|i| i.raw.dropped_files.clone());
        for f in dropped {
            let path = f.path().to_path_buf();
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            if matches!(ext, "pickle" | "pkl") {
                self.apply(DoctorCommand::OpenSnapshot(path), ctx);
            } else {
                match vramlab_core::fsutil::read_bounded(
                    &path,
                    vramlab_core::fsutil::FileKind::OomMessage,
                ) {
                    Ok(b) => {
                        self.text = String::from_utf8_lossy(&b).into_owned();
                        self.rediagnose();
                    }
                    Err(e) => self.error = Some(format!("{}: {e}", path.display())),
                }
            }
        }
    }

    /// Draws the panel; returns what the user asked for.
    pub fn ui(&mut self, ui: &mut Ui, hint: Option<&PlanAdvice>) -> Option<DoctorCommand> {
        let mut cmd = None;
        ui.label(RichText::new("OOM doctor").heading()).on_hover_text(
            "Paste the \"CUDA out of memory\" error, or open a torch.cuda.memory._dump_snapshot \
             pickle (or drop either on the window): the doctor says why it happened and what to change.",
        );
        let l = ui.label("OOM message");
        egui::ScrollArea::vertical()
            .id_salt("doctor_message_scroll")
            .max_height(120.0)
            .show(ui, |ui| {
                ui.add(
                    egui::TextEdit::multiline(&mut self.text)
                        .id_salt("doctor_message")
                        .hint_text(
                            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate …",
                        )
                        .desired_rows(5)
                        .desired_width(f32::INFINITY)
                        .font(egui::TextStyle::Monospace),
                )
                .labelled_by(l.id);
            });
        ui.horizontal(|ui| {
            if ui.button("Diagnose").clicked() {
                cmd = Some(DoctorCommand::Diagnose);
            }
            ui.separator();
            let l = ui.label("Snapshot file");
            ui.add(
                egui::TextEdit::singleline(&mut self.path)
                    .id_salt("doctor_path")
                    .hint_text("dump_snapshot.pickle")
                    .desired_width(360.0),
            )
            .labelled_by(l.id);
            if ui.button("Open snapshot").clicked() && !self.path.trim().is_empty() {
                cmd = Some(DoctorCommand::OpenSnapshot(PathBuf::from(self.path.trim())));
            }
            if ui.button("Browse…").clicked() {
                cmd = Some(DoctorCommand::BrowseSnapshot);
            }
            if ui.button("Clear").clicked() {
                cmd = Some(DoctorCommand::Clear);
            }
        });
        if let Some(l) = &self.loading {
            ui.horizontal(|ui| {
                let frac = if l.total > 0 {
                    l.read as f32 / l.total as f32
                } else {
                    0.0
                };
                ui.add(
                    egui::ProgressBar::new(frac)
                        .desired_width(300.0)
                        .text(format!(
                            "reading snapshot: {} of {}",
                            Bytes(l.read),
                            Bytes(l.total)
                        )),
                );
                if ui.button("Cancel").clicked() {
                    cmd = Some(DoctorCommand::Cancel);
                }
            });
        }
        if let Some(e) = &self.error {
            ui.colored_label(ui.visuals().error_fg_color, e);
        }
        ui.add_space(6.0);
        let diagnosis = |ui: &mut Ui| match &self.diagnosis {
            Some(d) => {
                diagnosis_ui(d, ui);
                if let Some(h) = hint.filter(|_| {
                    matches!(d.cause, doctor::Cause::Capacity | doctor::Cause::ProcessCap)
                }) {
                    hint_ui(h, ui);
                }
            }
            None if self.snapshot.is_some() => {
                ui.label("The snapshot records no out-of-memory error.");
            }
            None => {}
        };
        match &self.snapshot {
            Some((path, s)) => {
                let mut y = None;
                let mut plan_cmd = None;
                ui.columns(2, |cols| {
                    diagnosis(&mut cols[0]);
                    plan_cmd = model_box_ui(
                        &mut self.model,
                        &mut self.batch,
                        &mut self.loop_shape,
                        &mut cols[1],
                    );
                    y = snapshot_ui(
                        path,
                        s,
                        self.message.as_ref(),
                        self.named_plan.as_ref(),
                        &mut cols[1],
                    );
                });
                self.timeline_y = y.or(self.timeline_y);
                cmd = cmd.or(plan_cmd);
            }
            None => diagnosis(ui),
        }
        cmd
    }
}

/// Reads and analyses a snapshot file (on the worker thread; the panels crate does its own
/// file IO here rather than depending on the CLI).
fn read_and_analyze(
    path: &std::path::Path,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> Result<SnapshotReport, String> {
    let (file, total) =
        vramlab_core::fsutil::open_bounded(path, vramlab_core::fsutil::FileKind::Snapshot)
            .map_err(|e| e.to_string())?;
    let snap = doctor::read_snapshot(file, &mut |n| progress(n, total))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    doctor::analyze(&snap, None).map_err(|e| format!("{}: {e}", path.display()))
}

fn hint_ui(h: &PlanAdvice, ui: &mut Ui) {
    ui.add_space(4.0);
    ui.label(RichText::new("The planner, for the Planner tab's model").strong())
        .on_hover_text(
            "Set the model, precision and GPU that ran out of memory on the Planner tab.",
        );
    if let (Some(batch), Some(need)) = (h.batch, h.predicted_nvidia_smi_bytes) {
        let gpu = h
            .gpu_name
            .clone()
            .unwrap_or_else(|| format!("a {} GPU", h.capacity_bytes));
        ui.label(format!(
            "{} at batch {batch} needs {need} (nvidia-smi) on {gpu} ({} usable).",
            h.model, h.usable_bytes
        ));
    }
    ui.label(match h.max_batch {
        Some(m) => format!("Largest micro-batch that fits: {m}"),
        None => "Even batch 1 does not fit this GPU.".to_string(),
    });
    let fitting: Vec<String> = h
        .fitting_remedies()
        .map(|r| format!("{} ({})", r.name, r.nvidia_smi_bytes))
        .collect();
    if !fitting.is_empty() {
        ui.label(format!("Planned remedies that fit: {}", fitting.join(", ")));
    }
}

fn diagnosis_ui(d: &Diagnosis, ui: &mut Ui) {
    ui.label(
        RichText::new(format!(
            "Diagnosis: {} — {}",
            d.cause.as_str(),
            d.cause.label()
        ))
        .heading()
        .strong(),
    );
    ui.label(&d.summary);
    ui.add_space(4.0);
    ui.label(RichText::new("Evidence").strong());
    for e in &d.evidence {
        ui.label(format!("• {e}"));
    }
    ui.add_space(4.0);
    ui.label(RichText::new("What to change (most useful first)").strong());
    for (i, r) in d.remedies.iter().enumerate() {
        ui.label(RichText::new(format!("{}. {}", i + 1, r.title)).strong());
        ui.label(&r.detail);
        if let Some(s) = &r.setting {
            ui.horizontal(|ui| {
                ui.code(s);
                if ui.small_button("Copy").clicked() {
                    ui.ctx().copy_text(s.clone());
                }
            });
        }
    }
    let f = &d.figures;
    egui::CollapsingHeader::new("Figures")
        .id_salt("doctor_figures")
        .default_open(true)
        .show(ui, |ui| {
            egui::Grid::new("doctor_figures_grid")
                .striped(true)
                .show(ui, |ui| {
                    for (label, b) in f.labelled() {
                        ui.label(label);
                        ui.label(b.to_string());
                        ui.end_row();
                    }
                });
        });
}

/// The model that ran when the snapshot was recorded: the overlay is planned for it alone.
fn model_box_ui(
    model: &mut String,
    batch: &mut String,
    loop_shape: &mut LoopShape,
    ui: &mut Ui,
) -> Option<DoctorCommand> {
    let mut cmd = None;
    ui.horizontal(|ui| {
        let l = ui.label("Model of this snapshot").on_hover_text(
            "The model that ran when the snapshot was recorded (a preset name such as gpt2): \
                 its planned step is laid over the timeline. Nothing is laid over it until you \
                 name one.",
        );
        ui.add(
            egui::TextEdit::singleline(model)
                .id_salt("doctor_model")
                .hint_text("gpt2")
                .desired_width(140.0),
        )
        .labelled_by(l.id);
        let l = ui.label("Batch");
        ui.add(
            egui::TextEdit::singleline(batch)
                .id_salt("doctor_batch")
                .desired_width(50.0),
        )
        .labelled_by(l.id);
        egui::ComboBox::from_label("Loop")
            .selected_text(loop_shape.as_str())
            .show_ui(ui, |ui| {
                for l in LoopShape::ALL {
                    ui.selectable_value(loop_shape, l, l.as_str());
                }
            });
        if ui.button("Plan this model").clicked() {
            cmd = Some(DoctorCommand::PlanModel);
        }
    });
    cmd
}

/// A little above the highest curve of the timeline (GiB): the card's and the cap's lines
/// are drawn only up to half again as high, so the plot's automatic bounds follow the data.
pub fn timeline_y_max(s: &SnapshotReport, planned: Option<&[(f64, u64)]>) -> f64 {
    let data = s
        .timeline
        .iter()
        .map(|p| p.allocated_bytes.max(p.reserved_bytes))
        .chain(planned.unwrap_or(&[]).iter().map(|p| p.1))
        .max()
        .unwrap_or(0);
    (gib(data) * 1.1).max(1.0 / 1024.0)
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// Draws the snapshot's side; returns the timeline plot's y range (GiB).
fn snapshot_ui(
    path: &std::path::Path,
    s: &SnapshotReport,
    m: Option<&OomMessage>,
    named: Option<&SnapshotPlan>,
    ui: &mut Ui,
) -> Option<(f64, f64)> {
    ui.label(RichText::new("Snapshot").heading())
        .on_hover_text(path.display().to_string());
    ui.label(format!(
        "peak allocated {} · peak reserved {} · {} trace entries · expandable_segments {} · max_split_size {}",
        s.peak_allocated_bytes,
        s.peak_reserved_bytes,
        s.trace_entries,
        s.expandable_segments,
        s.max_split_size_bytes.map_or("unlimited".into(), |b| b.to_string())
    ));
    let alloc: PlotPoints = s
        .timeline
        .iter()
        .map(|p| [p.event as f64, gib(p.allocated_bytes)])
        .collect();
    let reserved: PlotPoints = s
        .timeline
        .iter()
        .map(|p| [p.event as f64, gib(p.reserved_bytes)])
        .collect();
    let planned =
        named.and_then(|h| doctor::overlay::overlay(&s.timeline, &h.planned).map(|o| (h, o)));
    if let Some((h, o)) = &planned {
        ui.label(format!(
            "Planned ({} at batch {}, {} loop, named for this snapshot): peak allocated {} vs {} \
             in the snapshot ({:+.1} %)",
            h.model,
            h.batch,
            h.loop_shape.as_str(),
            Bytes(o.planned_peak_allocated_bytes),
            Bytes(o.snapshot_peak_allocated_bytes),
            o.peak_difference_percent
        ))
        .on_hover_text(
            "The planned step is stretched onto the trace so that the two peaks line up: \
             compare the heights and the shape, not the positions in between. A snapshot far \
             above the plan points at something the step does not explain (a leak, a kept \
             graph, another model); far below, at other settings than planned.",
        );
    }
    let y_max = timeline_y_max(s, planned.as_ref().map(|(_, o)| o.points.as_slice()));
    // Lines for the card and the cap only where they fall within the data's range: on a
    // 140 GiB card a 3 GiB run would otherwise be a flat line at the bottom.
    let mut limits = Vec::new();
    if let Some(m) = m {
        for (name, v) in [
            ("GPU capacity", m.total_capacity_bytes),
            ("allowed (cap)", m.allowed_bytes),
        ] {
            if let Some(b) = v {
                if gib(b.0) <= y_max * 1.5 {
                    limits.push((name, gib(b.0)));
                } else {
                    ui.label(format!("{name}: {b} (above the chart)"));
                }
            }
        }
    }
    let shown = Plot::new("doctor_timeline")
        .height(220.0)
        .legend(Legend::default())
        .x_axis_label("trace entry")
        .y_axis_label("GiB")
        .include_y(0.0)
        .show(ui, |p| {
            p.line(Line::new("reserved", reserved));
            p.line(Line::new("allocated", alloc));
            if let Some((_, o)) = &planned {
                let pts: PlotPoints = o.points.iter().map(|&(x, b)| [x, gib(b)]).collect();
                p.line(
                    Line::new("planned allocated", pts).style(egui_plot::LineStyle::dashed_loose()),
                );
            }
            for (name, y) in &limits {
                p.hline(HLine::new(*name, *y));
            }
        });
    let b = shown.transform.bounds();
    if let Some(map) = &s.segment_map {
        segment_map_ui(map, ui);
    }
    if !s.top_sites.is_empty() {
        ui.label(RichText::new("Live at the peak, by allocation site").strong());
        egui::Grid::new("doctor_sites")
            .striped(true)
            .show(ui, |ui| {
                for site in &s.top_sites {
                    ui.label(site.bytes_at_peak.to_string());
                    ui.label(format!("{} blocks", site.blocks_at_peak));
                    ui.label(&site.site);
                    ui.end_row();
                }
            });
    }
    Some((b.min()[1], b.max()[1]))
}

fn segment_map_ui(map: &SegmentMap, ui: &mut Ui) {
    ui.label(RichText::new(format!("Segment map at the {}", map.at)).strong())
        .on_hover_text("Each row is one cudaMalloc'd segment (largest first); blue = allocated blocks, orange = free holes.");
    ui.label(format!(
        "{} segments · {} free inside them · largest free block {} · fragmentation {:.0} %",
        map.segment_count,
        map.free_in_segments_bytes,
        map.largest_free_block_bytes,
        map.fragmentation * 100.0
    ));
    let width = ui.available_width().clamp(200.0, 900.0);
    for seg in map.segments.iter().take(16) {
        ui.horizontal(|ui| {
            ui.add_sized(
                vec2(90.0, 14.0),
                egui::Label::new(Bytes(seg.size).to_string()),
            );
            let (rect, _) = ui.allocate_exact_size(vec2(width - 100.0, 12.0), Sense::hover());
            let painter = ui.painter_at(rect);
            painter.rect_filled(rect, 0.0, Color32::from_gray(60));
            for b in &seg.blocks {
                let x0 = rect.left() + rect.width() * (b.offset as f32 / seg.size.max(1) as f32);
                let x1 = rect.left()
                    + rect.width() * ((b.offset + b.size) as f32 / seg.size.max(1) as f32);
                let color = if b.allocated {
                    Color32::from_rgb(70, 130, 220)
                } else {
                    Color32::from_rgb(240, 150, 40)
                };
                painter.rect_filled(
                    egui::Rect::from_x_y_ranges(x0..=x1.max(x0 + 1.0), rect.y_range()),
                    0.0,
                    color,
                );
            }
        });
    }
}
