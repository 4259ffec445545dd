//! GUI tests of the Run and Monitor tabs, recent files and plot PNGs, through
//! egui_kittest. CI has no GPU: runs are fed from recorded events
//! (`BenchHandle::replay`), the monitor from fake sources.
//!
//! Snapshots: `UPDATE_SNAPSHOTS=1 cargo test --test gui_run`. Screenshots:
//! `cargo test --test gui_run -- --ignored write_run_screenshots` (the recorded H200 runs
//! of `tests/data/bench/`; set `VRAMLAB_RUN_JSON=run.json` to draw another saved run).

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use vramlab_core::export::results::{CSV_COLUMNS, run_from_json};
use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::search::{Budget, max_batch};
use vramlab_core::plan::{Planner, TrainConfig};
use vramlab_core::record::{Predicted, RUN_SCHEMA_VERSION};
use vramlab_core::units::Bytes;
use vramlab_device::bench::{
    BatchPlan, BenchEvent, BenchHandle, BenchRequest, DeviceInfo, EngineKind, MemSample, Outcome,
    Run, Trial,
};
use vramlab_device::gpu::monitor::{
    GpuSample, Monitor, MonitorEvent, NO_NVML, ProcessUsage, Reading, SampleSource, SourceFactory,
};
use vramlab_gui::app::{Tab, VramApp};

const W: f32 = 1400.0;
const H: f32 = 900.0;

fn harness(app: VramApp) -> Harness<'static, VramApp> {
    Harness::builder()
        .with_size(egui::vec2(W, H))
        .with_theme(egui::Theme::Dark)
        .with_max_steps(16)
        .build_ui_state(|ui, app: &mut VramApp| app.ui(ui), app)
}

fn shows(h: &Harness<'_, VramApp>, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

fn assert_shows(h: &Harness<'_, VramApp>, text: &str) {
    assert!(shows(h, text), "expected a widget showing {text:?}");
}

/// Steps frames (with real time passing, for worker threads) until `done`.
fn wait_for(
    h: &mut Harness<'_, VramApp>,
    what: &str,
    done: impl Fn(&Harness<'_, VramApp>) -> bool,
) {
    let t0 = Instant::now();
    while !done(h) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
        h.step();
    }
    // Not `run`: a live monitor keeps asking for repaints.
    h.run_steps(3);
}

fn open_tab(h: &mut Harness<'_, VramApp>, tab: Tab) {
    h.get_by_label(tab.label()).click();
    if tab == Tab::Monitor {
        // A live monitor keeps asking for repaints.
        h.run_steps(3);
    } else {
        h.run();
    }
    assert_eq!(h.state().tab(), tab);
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("vramlab-gui-run-{}-{name}", std::process::id()))
}

/// A measured run of the default GPT-2 config on an H200, made from the planner's own
/// prediction plus a few per cent (what a real run looks like), ending in an OOM.
fn synthetic_run() -> Run {
    let cfg = TrainConfig::default();
    let preset = find_builtin("gpt2").expect("gpt2");
    let planner = Planner::new(&preset, &cfg).expect("planner");
    let h200 = vramlab_words::find_gpu("h200").expect("h200");
    let budget = Budget {
        capacity: h200.memory(),
        margin: 0.05,
    };
    let predicted_max = max_batch(&planner, budget, 65536).expect("search");
    let top = predicted_max.unwrap_or(64);
    let mut batches = vec![8, 16, 32, 64, top];
    batches.dedup();
    batches.push(top + 1);
    let scale = |b: Bytes, f: f64| Bytes((b.0 as f64 * f) as u64);
    let trials = batches
        .iter()
        .enumerate()
        .map(|(i, &batch)| {
            let p = planner.peaks(batch).expect("peaks");
            let predicted = Some(Predicted::from(p));
            if batch > top {
                let mut t = Trial::failed(
                    i as u32,
                    batch,
                    Outcome::Oom {
                        message: "CUDA out of memory. Tried to allocate 1.50 GiB".into(),
                    },
                );
                t.predicted = predicted;
                return t;
            }
            let wobble = 1.0 + 0.02 * ((i as f64) - 2.0) / 2.0;
            let plan = planner.plan(batch).expect("plan");
            let n = plan.timeline.len().max(1);
            let stride = n.div_ceil(240);
            let timeline = plan
                .timeline
                .iter()
                .step_by(stride)
                .map(|tp| MemSample {
                    t_ms: f64::from(tp.index) * 0.05,
                    event: Some(tp.index),
                    measured: scale(tp.allocated, 1.03 * wobble),
                    predicted_allocated: Some(tp.allocated),
                    predicted_reserved: None,
                    label: String::new(),
                })
                .collect();
            // ~0.8 TFLOP per 1024-token sample at ~380 TFLOP/s, plus launch overhead.
            let flops = batch as f64 * 0.8e12;
            let step_ms = 3.0 + flops / 380e12 * 1000.0;
            Trial {
                index: i as u32,
                batch,
                outcome: Outcome::Ran,
                peak_allocated: Some(scale(p.allocated, 1.02 * wobble)),
                peak_reserved: Some(scale(p.reserved, 1.04 * wobble)),
                process_bytes: Some(scale(p.nvidia_smi, 1.05 * wobble)),
                device_used_peak: Some(scale(p.nvidia_smi, 1.05 * wobble)),
                baseline_before: Some(Bytes::mib(600)),
                baseline_after: Some(Bytes::mib(602)),
                step_ms: Some(step_ms),
                flops_per_step: Some(flops),
                tflops: Some(flops / (step_ms / 1000.0) / 1e12),
                predicted,
                timeline,
                world: None,
                ranks: Vec::new(),
            }
        })
        .collect();
    Run {
        schema_version: RUN_SCHEMA_VERSION,
        engine: EngineKind::Native,
        device: DeviceInfo {
            name: "NVIDIA H200".into(),
            total_bytes: h200.memory(),
            driver: Some("580.159.04".into()),
            ..DeviceInfo::default()
        },
        model: "gpt2".into(),
        config: cfg,
        size: planner.size,
        started_unix: 1_767_000_000,
        vramlab_version: env!("CARGO_PKG_VERSION").into(),
        predicted_max_batch: predicted_max,
        trials,
        stopped: None,
        inference: None,
    }
}

/// What an engine streams for `run`.
fn events_of(run: &Run) -> Vec<BenchEvent> {
    let mut ev = vec![BenchEvent::Started {
        engine: run.engine,
        device: run.device.clone(),
        planned: Some(run.trials.len() as u32),
    }];
    for t in &run.trials {
        ev.push(BenchEvent::Progress {
            trial: t.index,
            batch: t.batch,
            phase: "backward".into(),
            fraction: 0.5,
        });
        ev.push(BenchEvent::TrialDone { trial: t.clone() });
    }
    ev.push(BenchEvent::Finished { run: run.clone() });
    ev
}

type Requests = Rc<RefCell<Vec<BenchRequest>>>;

/// An app whose Start replays `events` and records the request.
fn replay_app(events: Vec<BenchEvent>) -> (VramApp, Requests) {
    let mut app = VramApp::new_for_test(None);
    let reqs: Requests = Rc::default();
    let r2 = reqs.clone();
    app.set_spawner(Box::new(move |req, _notify| {
        r2.borrow_mut().push(req);
        BenchHandle::replay(events.clone())
    }));
    app.set_monitor(failing_monitor());
    (app, reqs)
}

fn failing_monitor() -> vramlab_gui::app::MonitorOpener {
    Box::new(|notify| {
        let open: SourceFactory = Box::new(|| anyhow::bail!("libnvidia-ml.so.1 not found"));
        Monitor::start(open, Duration::from_millis(5), notify)
    })
}

/// An app showing the synthetic run, replayed through Start.
fn app_with_run(run: &Run) -> Harness<'static, VramApp> {
    let (app, _) = replay_app(events_of(run));
    let mut h = harness(app);
    h.run();
    open_tab(&mut h, Tab::Run);
    h.get_by_label("Start").click();
    h.run();
    h
}

#[test]
fn run_tab_shows_the_form_for_the_planner_model() {
    let (app, _) = replay_app(vec![]);
    let mut h = harness(app);
    h.run();
    open_tab(&mut h, Tab::Run);
    assert_shows(&h, "Run on the GPU");
    assert_shows(&h, "GPT-2 (124M) · AMP BF16");
    assert_shows(&h, "No run to show yet");
    assert!(h.query_by_label("Batch list").is_some());
    assert!(h.query_by_label("Steps per trial").is_some());
    assert!(h.query_by_label("Python").is_none());
    h.get_by_label(EngineKind::Torch.label()).click();
    h.run();
    assert_eq!(h.state().state.run.engine, EngineKind::Torch);
    assert!(h.query_by_label("Python").is_some());
    h.get_by_label("Sweep until OOM").click();
    h.run();
    assert!(h.query_by_label("Batch list").is_none());
    // The sweep starts at the planner's max batch for the target GPU (12 on a 4090).
    let max = h
        .state()
        .derived()
        .max_batch()
        .and_then(|m| m.clone().ok().flatten())
        .expect("max batch");
    assert_shows(
        &h,
        &format!("Starts at batch {max}, the predicted max batch"),
    );
    // Back to the planner: its panels are still there.
    open_tab(&mut h, Tab::Planner);
    assert_shows(&h, "FITS");
}

#[test]
fn start_without_a_gpu_shows_the_engine_error_and_the_app_goes_on() {
    if vramlab_device::gpu::detect().is_some() {
        eprintln!("skipped: a GPU is present, the run would really start");
        return;
    }
    let mut app = VramApp::new_for_test(None);
    app.set_monitor(failing_monitor());
    let mut h = harness(app);
    h.run();
    open_tab(&mut h, Tab::Run);
    h.get_by_label("Start").click();
    h.run();
    wait_for(&mut h, "the engine error", |h| {
        !h.state().runs().is_running()
    });
    let err = h.state().runs().error.clone().expect("an error");
    assert!(!err.is_empty());
    assert_shows(&h, &err);
    assert!(
        h.state().runs().runs.is_empty(),
        "a failed start keeps no run"
    );
    // Still interactive: the form works and Start is available again.
    h.get_by_label("dismiss").click();
    h.run();
    assert!(h.state().runs().error.is_none());
    open_tab(&mut h, Tab::Planner);
    assert_shows(&h, "FITS");
}

#[test]
fn a_replayed_run_shows_rows_errors_max_batch_and_plots() {
    let run = synthetic_run();
    let (app, reqs) = replay_app(events_of(&run));
    let mut h = harness(app);
    h.run();
    open_tab(&mut h, Tab::Run);
    h.get_by_label("Batch list").click();
    h.run();
    h.get_by_label("Batch list").type_text(",32");
    h.run();
    h.get_by_label("Start").click();
    h.run();
    // The request is the planner's model and config with the batches in the field: the
    // plan's proposal (from its max batch) and the typed one.
    let req = reqs.borrow()[0].clone();
    assert_eq!(req.preset.id, "gpt2");
    assert_eq!(req.config, h.state().state.config);
    let mut want = vramlab_gui::ui::run::proposed_batches(req.predicted_max_batch);
    want.push(32);
    assert_eq!(req.batches, BatchPlan::List(want));
    assert_eq!(req.engine, EngineKind::Native);

    let runs = h.state().runs();
    assert!(!runs.is_running());
    let shown = runs.shown().expect("shown run");
    assert_eq!(shown.run, run);
    let max = run.max_batch_ran().expect("ran");
    assert_shows(&h, "Largest batch that ran");
    assert!(h.query_all_by_label(&max.to_string()).next().is_some());
    assert_shows(&h, "First OOM");
    assert_shows(&h, "OOM");
    assert_shows(&h, "Finished: 6 trials.");
    for t in &run.trials {
        assert!(
            h.query_all_by_label(&t.batch.to_string()).next().is_some(),
            "row of batch {}",
            t.batch
        );
        // The native engine shows what it checks, not a PyTorch comparison.
        if let Some(e) = vramlab_gui::ui::run::table::device_vs_predicted_pct(t) {
            assert_shows(&h, &format!("{e:+.1} %"));
        }
    }
    assert_shows(
        &h,
        "so its allocated and reserved bytes are the plan itself",
    );
    assert_shows(&h, "Used vs predicted");
    assert!(h.query_by_label("error %").is_none());
    assert_shows(&h, "Peak memory vs batch size");
    assert_shows(&h, "Memory through one trial");
    // The timeline shows the largest batch that ran; clicking a row picks another.
    let shown_batch = |h: &Harness<'_, VramApp>| {
        h.state()
            .runs()
            .shown()
            .and_then(|r| r.shown_trial())
            .map(|t| t.batch)
    };
    assert_eq!(shown_batch(&h), Some(max));
    h.get_by_label("8").click();
    h.run();
    assert_eq!(shown_batch(&h), Some(8));
}

#[test]
fn cancel_stops_a_live_run() {
    let run = synthetic_run();
    let mut events = events_of(&run);
    events.truncate(4); // Started, Progress, TrialDone, Progress: still running.
    let (app, _) = replay_app(events);
    let mut h = harness(app);
    h.run();
    open_tab(&mut h, Tab::Run);
    h.get_by_label("Start").click();
    // Not `run`: a live run animates its progress bar.
    h.run_steps(3);
    assert!(h.state().runs().is_running());
    assert_shows(&h, "trial 2/6 · batch 16 · backward");
    h.get_by_label("Cancel").click();
    h.run();
    let runs = h.state().runs();
    assert!(!runs.is_running());
    let shown = runs.shown().expect("kept");
    assert_eq!(shown.run.stopped.as_deref(), Some("cancelled"));
    assert_eq!(shown.run.trials.len(), 1);
    assert_shows(&h, "Cancelled: 1 trials.");
}

#[test]
fn batch_list_errors_are_shown_and_block_start() {
    let (app, reqs) = replay_app(vec![]);
    let mut h = harness(app);
    h.run();
    open_tab(&mut h, Tab::Run);
    h.get_by_label("Batch list").click();
    h.run();
    h.get_by_label("Batch list").type_text(",x");
    h.run();
    assert_shows(&h, "batch list: `x` is not a whole number");
    h.get_by_label("Start").click();
    h.run();
    assert!(reqs.borrow().is_empty(), "Start is disabled");
}

#[test]
fn saved_json_and_csv_round_trip_and_open_for_comparison() {
    let run = synthetic_run();
    let mut h = app_with_run(&run);
    let json = temp_path("run.json");
    let csv = temp_path("run.csv");
    let target = Rc::new(RefCell::new(json.clone()));
    let suggested = Rc::new(RefCell::new(String::new()));
    let (t2, s2, open) = (target.clone(), suggested.clone(), json.clone());
    h.state_mut().set_dialogs(
        Box::new(move |name| {
            *s2.borrow_mut() = name.to_string();
            Some(t2.borrow().clone())
        }),
        Box::new(move || Some(open.clone())),
    );
    h.get_by_label("Save JSON…").click();
    h.run();
    assert!(
        suggested.borrow().ends_with(".run.json"),
        "{}",
        suggested.borrow()
    );
    let back = run_from_json(&std::fs::read(&json).expect("saved")).expect("parses");
    assert_eq!(back, run);

    *target.borrow_mut() = csv.clone();
    h.get_by_label("Save CSV…").click();
    h.run();
    let text = std::fs::read_to_string(&csv).expect("csv");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], CSV_COLUMNS.join(","));
    assert_eq!(lines.len(), run.trials.len() + 1);

    // Open the saved JSON: a second run to compare; overlay the first on it.
    h.get_by_label("Open run…").click();
    h.run();
    assert_shows(&h, "Opened ");
    let runs = h.state().runs();
    assert_eq!(runs.runs.len(), 2);
    let shown = runs.shown().expect("shown");
    assert_eq!(shown.run, run);
    assert!(shown.label().contains("run.json"));
    let first = runs.runs[1].id;
    let boxes: Vec<_> = h.get_all_by_label("compare").collect();
    assert_eq!(boxes.len(), 2);
    boxes[1].click();
    h.run();
    assert!(h.state().runs().run(first).expect("first").overlay);
    std::fs::remove_file(&json).ok();
    std::fs::remove_file(&csv).ok();
}

#[test]
fn a_malformed_run_file_names_the_field() {
    let path = temp_path("bad-run.json");
    let text = vramlab_core::export::results::run_to_json(&synthetic_run()).replacen(
        "\"engine\": \"native\"",
        "\"engine\": \"tpu\"",
        1,
    );
    std::fs::write(&path, text).expect("write");
    let (mut app, _) = replay_app(vec![]);
    let p = path.clone();
    app.set_dialogs(Box::new(|_| None), Box::new(move || Some(p.clone())));
    let mut h = harness(app);
    h.run();
    open_tab(&mut h, Tab::Run);
    h.get_by_label("Open run…").click();
    h.run();
    assert_shows(&h, "Could not open");
    assert_shows(&h, "engine: unknown variant `tpu`");
    assert!(h.state().runs().runs.is_empty());
    std::fs::remove_file(&path).ok();
}

#[test]
fn monitor_without_nvml_says_so() {
    let (app, _) = replay_app(vec![]);
    let mut h = harness(app);
    h.run();
    open_tab(&mut h, Tab::Monitor);
    wait_for(&mut h, "the monitor state", |h| shows(h, NO_NVML));
    assert_shows(&h, "libnvidia-ml.so.1 not found");
}

#[test]
fn monitor_with_the_real_nvml_never_crashes() {
    let mut h = harness(VramApp::new_for_test(None));
    h.run();
    open_tab(&mut h, Tab::Monitor);
    wait_for(&mut h, "the monitor state", |h| !shows(h, "Opening NVML"));
    if vramlab_device::gpu::detect().is_none() {
        assert_shows(&h, NO_NVML);
    }
}

/// A GPU that a training process fills up.
struct FakeGpu {
    step: u64,
}

impl SampleSource for FakeGpu {
    fn device_name(&self) -> String {
        // Labelled: screenshots/monitor.png is drawn from this synthetic load.
        "NVIDIA H200 · DEMO DATA (synthetic load, not a measurement)".into()
    }
    fn read(&mut self) -> anyhow::Result<Reading> {
        self.step += 1;
        let used = Bytes::gib(1 + (self.step * 7) % 90);
        Ok(Reading {
            used,
            total: Bytes::gib(140),
            util_pct: Some(90 + (self.step % 9) as u32),
            processes: vec![
                ProcessUsage {
                    pid: 4242,
                    name: "python3".into(),
                    used: Some(used.saturating_sub(Bytes::mib(512))),
                },
                ProcessUsage {
                    pid: 977,
                    name: "Xorg".into(),
                    used: Some(Bytes::mib(512)),
                },
            ],
        })
    }
}

/// A fake GPU; with `history`, five minutes of a training run already in the window.
fn fake_monitor(history: bool) -> vramlab_gui::app::MonitorOpener {
    Box::new(move |notify| {
        // With history the first live sample continues its plateau (~80 GiB).
        let step = if history { 11 } else { 0 };
        let open: SourceFactory =
            Box::new(move || Ok(Box::new(FakeGpu { step }) as Box<dyn SampleSource>));
        let period = if history { 60_000 } else { 2 };
        let mut m = Monitor::start(open, Duration::from_millis(period), notify);
        if history {
            for i in 0..600u32 {
                let t = f64::from(i) * 0.5 - 300.0;
                // Idle, then a training run: ramp to a plateau with per-step ripples.
                let load = if t < -240.0 {
                    0.0
                } else {
                    ((t + 240.0) / 20.0).min(1.0)
                };
                let ripple = if load > 0.0 {
                    4.0 * ((f64::from(i) * 0.9).sin() + 1.0)
                } else {
                    0.0
                };
                let used = Bytes(((0.6 + load * 78.0 + ripple) * (1u64 << 30) as f64) as u64);
                m.model.apply(MonitorEvent::Sample(GpuSample {
                    t_secs: t,
                    reading: Reading {
                        used,
                        total: Bytes::gib(140),
                        util_pct: Some(if load > 0.0 { 90 + (i % 9) } else { 0 }),
                        processes: Vec::new(),
                    },
                }));
            }
        }
        m
    })
}

#[test]
fn monitor_shows_usage_and_processes() {
    let mut app = VramApp::new_for_test(None);
    app.set_monitor(fake_monitor(false));
    let mut h = harness(app);
    h.run();
    open_tab(&mut h, Tab::Monitor);
    wait_for(&mut h, "samples", |h| shows(h, "python3"));
    assert_shows(&h, "Live GPU monitor · NVIDIA H200");
    assert_shows(&h, "Xorg");
    assert_shows(&h, "4242");
    assert_shows(&h, "Processes on the GPU");
}

#[test]
fn recent_files_reopen_and_missing_ones_leave_the_list() {
    let path = temp_path("recent.vramlab.json");
    let p = path.clone();
    let (mut app, _) = replay_app(vec![]);
    app.set_dialogs(Box::new(move |_| Some(p.clone())), Box::new(|| None));
    let mut h = harness(app);
    h.run();
    h.get_by_label("Batch size").set_value_accesskit(21.0);
    h.run();
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::S);
    h.run();
    let key = path.display().to_string();
    assert_eq!(h.state().state.recent, vec![key.clone()]);
    h.get_by_label("Batch size").set_value_accesskit(3.0);
    h.run();
    h.get_by_label("Recent").click();
    h.run();
    h.get_by_label(&key).click();
    h.run();
    assert_eq!(h.state().state.config.batch, 21);
    assert_shows(&h, "Opened ");

    std::fs::remove_file(&path).expect("remove");
    h.get_by_label("Recent").click();
    h.run();
    h.get_by_label(&key).click();
    h.run();
    assert_shows(&h, "no longer exists; it was removed from the Recent list");
    assert!(h.state().state.recent.is_empty());
    // The list is persisted with the state; old state without it still loads.
    let partial: vramlab_gui::ui::PlannerState =
        serde_json::from_str(r#"{"version": 1}"#).expect("partial");
    assert!(partial.recent.is_empty());
}

#[test]
fn save_png_writes_the_cropped_plot() {
    let path = temp_path("plot.png");
    let p = path.clone();
    let name = Rc::new(RefCell::new(String::new()));
    let n2 = name.clone();
    let mut app = VramApp::new_for_test(None);
    app.set_dialogs(
        Box::new(move |s| {
            *n2.borrow_mut() = s.to_string();
            Some(p.clone())
        }),
        Box::new(|| None),
    );
    let mut h = harness(app);
    h.run();
    let buttons: Vec<_> = h.get_all_by_label("Save PNG…").collect();
    assert_eq!(buttons.len(), 2, "batch and timeline plots");
    buttons[0].click();
    h.run();
    wait_for(&mut h, "the PNG", |_| path.exists());
    assert_eq!(name.borrow().as_str(), "memory-vs-batch.png");
    let bytes = std::fs::read(&path).expect("png");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let rect = vramlab_gui::ui::png::plot_rect(&h.ctx, vramlab_gui::ui::png::PlotId::PlannerBatch)
        .expect("rect");
    let info = png_size(&bytes);
    let ppp = h.ctx.pixels_per_point();
    assert!(
        (info.0 as f32 - rect.width() * ppp).abs() <= 2.0,
        "{info:?} vs {rect:?}"
    );
    assert!(
        (info.1 as f32 - rect.height() * ppp).abs() <= 2.0,
        "{info:?} vs {rect:?}"
    );
    std::fs::remove_file(&path).ok();
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&bytes[16..20]), be(&bytes[20..24]))
}

/// The native engine's table: fits, device used vs predicted nvidia-smi, step, TFLOP/s.
#[test]
fn snapshot_native_run_table() {
    let run = synthetic_run();
    assert_eq!(run.engine, EngineKind::Native);
    let mut h = Harness::builder()
        .with_size(egui::vec2(1000.0, 300.0))
        .with_theme(egui::Theme::Dark)
        .build_ui(move |ui| {
            vramlab_gui::ui::style::apply(ui.ctx());
            let _ =
                vramlab_gui::ui::run::table::results_table_ui(&run.trials, run.engine, None, ui);
        });
    h.run();
    h.snapshot("run-table-native");
}

#[test]
fn snapshot_run_panel() {
    let mut h = app_with_run(&synthetic_run());
    no_pointer(&mut h);
    h.snapshot("run-panel");
}

/// Moves the pointer off the window (no hover highlight in screenshots).
fn no_pointer(h: &mut Harness<'_, VramApp>) {
    h.input_mut().events.push(egui::Event::PointerGone);
    h.run_steps(2);
}

/// The recorded H200 runs docs/bench.md shows, as (saved run in `tests/data/bench/`, PNG).
const RECORDED_SHOTS: [(&str, &str); 2] = [
    ("vit_b_16-native.json", "run.png"),
    ("gpt2-torch-primed.json", "run-torch.png"),
];

/// Draws the Run tab showing the saved run `json` and writes it to `dir/png`.
fn write_run_shot(dir: &std::path::Path, json: &std::path::Path, png: &str) {
    let bytes = std::fs::read(json).expect("the saved run is readable");
    let run = run_from_json(&bytes).expect("a saved run");
    let mut app = VramApp::new_for_test(None);
    app.state.preset_id = run.model.clone();
    app.state.config = run.config;
    let mut h = harness(app);
    h.run();
    let source = json.file_name().map_or_else(
        || json.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    h.state_mut().show_run(run, &source);
    open_tab(&mut h, Tab::Run);
    no_pointer(&mut h);
    let img = h.render().expect("render");
    img.save(dir.join(png)).expect("save png");
    println!("wrote {} from {}", dir.join(png).display(), json.display());
}

/// Writes `screenshots/run.png` and `run-torch.png` from the recorded H200 runs in
/// `tests/data/bench/` (or `VRAMLAB_RUN_JSON` to `VRAMLAB_RUN_PNG`, default `run.png`),
/// and `screenshots/monitor.png` (demo data, labelled so) at 1400×900.
#[test]
#[ignore = "generator: cargo test -p vramlab-gui --test tests -- --ignored write_run_screenshots"]
fn write_run_screenshots() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = root.join("screenshots");
    std::fs::create_dir_all(&dir).expect("screenshots dir");
    match std::env::var_os("VRAMLAB_RUN_JSON") {
        Some(json) => {
            let png = std::env::var("VRAMLAB_RUN_PNG").unwrap_or_else(|_| "run.png".into());
            write_run_shot(&dir, std::path::Path::new(&json), &png);
        }
        None => {
            for (json, png) in RECORDED_SHOTS {
                write_run_shot(&dir, &root.join("tests/data/bench").join(json), png);
            }
        }
    }

    let mut app = VramApp::new_for_test(None);
    app.set_monitor(fake_monitor(true));
    let mut h = harness(app);
    h.run();
    open_tab(&mut h, Tab::Monitor);
    wait_for(&mut h, "the first live sample", |h| shows(h, "python3"));
    no_pointer(&mut h);
    let img = h.render().expect("render");
    img.save(dir.join("monitor.png")).expect("save png");
    println!("wrote {}", dir.join("monitor.png").display());
}

/// A multi-GPU run (recorded, no GPU) shows how its world ran and every rank's peaks.
#[test]
fn a_distributed_run_shows_its_world_and_every_rank() {
    use vramlab_core::plan::distributed::{Distributed, Strategy};
    use vramlab_core::record::{RankPeak, WorldMode, WorldRun};
    let mut run = synthetic_run();
    run.engine = EngineKind::Torch;
    run.config.distributed = Distributed::new(2, Strategy::Fsdp2);
    run.trials.truncate(2);
    for t in &mut run.trials {
        t.world = Some(WorldRun {
            mode: WorldMode::Torchrun,
            size: 2,
            strategy: "fsdp2".into(),
        });
        t.ranks = (0..2u32)
            .map(|rank| RankPeak {
                rank,
                peak_allocated: Some(Bytes::gib(u64::from(rank) + 1)),
                peak_reserved: Some(Bytes::gib(3)),
                nvml_used: None,
                oom: false,
            })
            .collect();
    }
    let (mut app, _) = replay_app(vec![]);
    app.show_run(run, "recorded-fsdp2.run.json");
    let mut h = harness(app);
    h.run();
    open_tab(&mut h, Tab::Run);
    h.run();
    assert_shows(
        &h,
        "world 2 · fsdp2 · torchrun: 2 processes on 2 GPUs, NCCL",
    );
    assert_shows(&h, "rank 0: allocated 1.00 GiB · reserved 3.00 GiB");
    assert_shows(&h, "rank 1: allocated 2.00 GiB");
    assert_shows(&h, "max over 2 ranks: allocated 2.00 GiB");
}

/// DEMO data, not a measurement: an inference run (TinyLlama-1.1B generate, prompt 512 + 128
/// new tokens, bf16, the planner's Inference-mode default call) built from the inference
/// plan's own prediction plus 1–3 %, on an H200, batches 1, 8 and 32, then an OOM at 4096.
fn demo_infer_run(planner: &vramlab_core::plan::inference::InferPlanner) -> Run {
    let h200 = vramlab_words::find_gpu("h200").expect("h200");
    let scale = |b: Bytes, f: f64| Bytes((b.0 as f64 * f) as u64);
    let trials = [1u64, 8, 32, 4096]
        .iter()
        .enumerate()
        .map(|(i, &batch)| {
            let p = planner.peaks(batch).expect("peaks");
            let predicted = Some(Predicted::from(p));
            let mut t = if batch == 4096 {
                Trial::failed(
                    i as u32,
                    batch,
                    Outcome::Oom {
                        message: "CUDA out of memory. Tried to allocate 7.81 GiB".into(),
                    },
                )
            } else {
                let mut t = Trial::failed(i as u32, batch, Outcome::Ran);
                t.peak_allocated = Some(scale(p.allocated, 1.01));
                t.peak_reserved = Some(scale(p.reserved, 1.03));
                t.process_bytes = Some(scale(p.nvidia_smi, 1.02));
                t.step_ms = Some(900.0 + 40.0 * batch as f64);
                t
            };
            t.predicted = predicted;
            t
        })
        .collect();
    let mut config = TrainConfig::default();
    config.allocator = planner.config.allocator;
    Run {
        schema_version: RUN_SCHEMA_VERSION,
        engine: EngineKind::Torch,
        device: DeviceInfo {
            name: "NVIDIA H200 (demo)".into(),
            total_bytes: h200.memory(),
            driver: Some("580.159.04".into()),
            ..DeviceInfo::default()
        },
        model: "TinyLlama-1.1B".into(),
        config,
        size: planner.config.prompt,
        started_unix: 1_767_000_000,
        vramlab_version: env!("CARGO_PKG_VERSION").into(),
        predicted_max_batch: None,
        trials,
        stopped: None,
        inference: Some(Box::new(vramlab_core::record::InferRun::of(planner))),
    }
}

/// Issue 29: with the planner in Inference mode the Run tab benches the inference call —
/// the PyTorch engine (no engine choice, no steps), the request carries the Inference
/// mode's planner, each trial is compared with the inference plan, and the plot's predicted
/// curve is the inference plan's (a replay of demo data; CI has no GPU).
#[test]
fn inference_mode_runs_the_inference_bench() {
    use vramlab_core::plan::inference::{InferPlanner, InferStep};
    let (app, reqs) = replay_app(Vec::new());
    let mut h = harness(app);
    h.run();
    h.get_by_label("Inference call").click();
    h.run();
    h.get_by_label("Search").click();
    h.run();
    h.get_by_label("Search").type_text("Tiny");
    h.run();
    h.get_by_label("TinyLlama 1.1B").click();
    h.run();
    let planner: InferPlanner = h
        .state()
        .derived()
        .infer
        .planner()
        .cloned()
        .expect("TinyLlama's inference planner");
    let run = demo_infer_run(&planner);
    let events = events_of(&run);
    h.state_mut().set_spawner(Box::new({
        let reqs = reqs.clone();
        move |req, _notify| {
            reqs.borrow_mut().push(req);
            BenchHandle::replay(events.clone())
        }
    }));
    open_tab(&mut h, Tab::Run);
    assert_shows(&h, "Measures the planner's inference call:");
    assert_shows(
        &h,
        "TinyLlama 1.1B · generate · prompt 512 + 128 new · bf16 · sdpa · dynamic KV cache",
    );
    assert!(h.query_by_label("Steps per trial").is_none());
    assert!(h.query_by_label(EngineKind::Native.label()).is_none());
    assert!(h.query_by_label("Python").is_some());
    assert_shows(&h, "each batch runs in a fresh infer_runner.py process");
    h.get_by_label("Start").click();
    h.run();
    let req = reqs.borrow()[0].clone();
    assert_eq!(req.engine, EngineKind::Torch);
    assert_eq!(req.preset.id, "TinyLlama-1.1B");
    let bench = req.inference.as_ref().expect("an inference request");
    assert_eq!(bench.planner.config.step, InferStep::Generate);
    assert_eq!(
        (bench.planner.config.prompt, bench.planner.config.new_tokens),
        (512, 128)
    );
    // the batches proposed from the inference plan's max batch, not the training plan's
    let max = h.state().derived().infer.max_batch();
    assert_eq!(req.predicted_max_batch, max);
    assert_eq!(
        req.batches,
        BatchPlan::List(vramlab_gui::ui::run::proposed_batches(max))
    );

    let runs = h.state().runs();
    assert!(!runs.is_running());
    let shown = runs.shown().expect("shown run");
    assert_eq!(shown.run, run);
    // the predicted curve is the inference plan's
    let curve = shown.curve().expect("a predicted curve");
    let pt = curve.points.iter().find(|p| p.batch > 1).expect("a point");
    assert_eq!(
        pt.allocated,
        planner.peaks(pt.batch).expect("peaks").allocated
    );
    assert_shows(&h, "generate · prompt 512 + 128 new");
    assert_shows(&h, "Peak memory vs batch size");
    assert_shows(&h, "Largest batch that ran");
    assert_shows(&h, "Finished: 4 trials.");
    for t in &run.trials {
        assert!(
            h.query_all_by_label(&t.batch.to_string()).next().is_some(),
            "row of batch {}",
            t.batch
        );
    }
    // measured 1 % over the plan: the error the table shows
    assert_shows(&h, "-1.0 %");
}
