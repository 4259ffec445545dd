//! The Doctor tab through egui_kittest: a pasted message, a dropped snapshot (recorded on
//! an H200, tests/data/doctor/), errors shown, and its snapshot.

use std::path::PathBuf;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/doctor")
        .join(name)
}

use std::time::{Duration, Instant};

use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use vramlab_gui::app::{Tab, VramApp};

fn harness() -> Harness<'static, VramApp> {
    Harness::builder()
        .with_size(egui::vec2(1400.0, 900.0))
        .with_theme(egui::Theme::Dark)
        .with_max_steps(16)
        .build_ui_state(
            |ui, app: &mut VramApp| app.ui(ui),
            VramApp::new_for_test(None),
        )
}

fn shows(h: &Harness<'_, VramApp>, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

fn open_doctor(h: &mut Harness<'_, VramApp>) {
    h.run();
    h.get_by_label(Tab::Doctor.label()).click();
    h.run();
    assert_eq!(h.state().tab(), Tab::Doctor);
}

fn type_into(h: &mut Harness<'_, VramApp>, role: Role, label: &str, text: &str) {
    h.get_by_role_and_label(role, label).focus();
    h.run();
    h.get_by_role_and_label(role, label).type_text(text);
    h.run();
}

fn wait_loaded(h: &mut Harness<'_, VramApp>) {
    let t0 = Instant::now();
    while h.state().doctor.is_loading() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "snapshot never loaded"
        );
        std::thread::sleep(Duration::from_millis(20));
        h.step();
    }
    h.run();
}

#[test]
fn pasted_message_is_diagnosed() {
    let mut h = harness();
    open_doctor(&mut h);
    let text = std::fs::read_to_string(data("process_cap.message.txt")).expect("message");
    type_into(&mut h, Role::MultilineTextInput, "OOM message", &text);
    h.run();
    assert_eq!(h.state().doctor.text, text, "typed into the message box");
    h.get_by_label("Diagnose").click();
    h.run();
    assert!(h.state().doctor.diagnosis().is_some(), "diagnosed");
    assert!(shows(&h, "Diagnosis: process_cap"));
    assert!(shows(&h, "set_per_process_memory_fraction("));
    let d = h.state().doctor.diagnosis().expect("diagnosis");
    assert_eq!(d.cause, vramlab_core::doctor::Cause::ProcessCap);
}

#[test]
fn snapshot_opens_in_the_background_and_shows_the_map() {
    let mut h = harness();
    open_doctor(&mut h);
    let path = data("fragmentation.snapshot.pickle");
    type_into(
        &mut h,
        Role::TextInput,
        "Snapshot file",
        path.to_str().expect("path"),
    );
    h.run();
    h.get_by_label("Open snapshot").click();
    h.step();
    wait_loaded(&mut h);
    assert!(
        h.state().doctor.snapshot().is_some(),
        "loaded: {:?}",
        h.state().doctor.path
    );
    assert!(shows(&h, "Diagnosis: fragmentation"), "no diagnosis shown");
    assert!(shows(&h, "Segment map at the oom"));
    assert!(shows(&h, "largest free block 128.00 MiB"));
    let s = h.state().doctor.snapshot().expect("snapshot");
    assert!(!s.timeline.is_empty());
    h.get_by_label("Clear").click();
    h.run();
    assert!(h.state().doctor.snapshot().is_none());
}

#[test]
fn a_bad_snapshot_shows_the_error() {
    let mut h = harness();
    open_doctor(&mut h);
    let path = data("capacity.message.txt");
    type_into(
        &mut h,
        Role::TextInput,
        "Snapshot file",
        path.to_str().expect("path"),
    );
    h.run();
    h.get_by_label("Open snapshot").click();
    h.step();
    wait_loaded(&mut h);
    assert!(
        shows(&h, "capacity.message.txt: snapshot:"),
        "the error names the file"
    );
    assert!(h.state().doctor.snapshot().is_none());
}

#[test]
fn snapshot_doctor_tab() {
    let mut h = harness();
    open_doctor(&mut h);
    let text = std::fs::read_to_string(data("fragmentation.message.txt")).expect("message");
    type_into(&mut h, Role::MultilineTextInput, "OOM message", &text);
    // Relative (tests run in the package root): the picture must not depend on the checkout.
    type_into(
        &mut h,
        Role::TextInput,
        "Snapshot file",
        "../../tests/data/doctor/fragmentation.snapshot.pickle",
    );
    h.run();
    h.get_by_label("Open snapshot").click();
    h.step();
    wait_loaded(&mut h);
    // A missing file would paint its error into the picture: fail here instead.
    assert!(
        h.state().doctor.snapshot().is_some(),
        "the snapshot file did not load"
    );
    h.input_mut().events.push(egui::Event::PointerGone);
    h.run_steps(2);
    h.snapshot("doctor-tab");
}

#[test]
fn capacity_shows_the_planner_tab_model() {
    let mut h = harness();
    open_doctor(&mut h);
    let text = std::fs::read_to_string(data("capacity.message.txt")).expect("message");
    type_into(&mut h, Role::MultilineTextInput, "OOM message", &text);
    h.get_by_label("Diagnose").click();
    h.run();
    assert!(shows(&h, "Diagnosis: capacity"));
    let max = h
        .state()
        .derived()
        .max_batch()
        .and_then(|m| m.clone().ok().flatten())
        .expect("the default model fits the default GPU");
    assert!(shows(&h, &format!("Largest micro-batch that fits: {max}")));
}

fn open_snapshot(h: &mut Harness<'_, VramApp>, name: &str) {
    let path = data(name);
    h.state_mut().doctor.path.clear();
    type_into(
        h,
        Role::TextInput,
        "Snapshot file",
        path.to_str().expect("path"),
    );
    h.run();
    h.get_by_label("Open snapshot").click();
    h.step();
    wait_loaded(h);
    assert!(h.state().doctor.snapshot().is_some(), "{name} did not load");
}

#[test]
fn a_snapshot_is_not_overlaid_with_the_planner_tabs_model() {
    let mut h = harness();
    open_doctor(&mut h);
    open_snapshot(&mut h, "normal.snapshot.pickle");
    // The Planner tab has an answer (GPT-2 at batch 8), but nobody said it ran here.
    assert!(vramlab_gui::ui::doctor::planner_advice(h.state().derived()).is_some());
    assert!(h.state().doctor.named_plan().is_none());
    assert!(!shows(&h, "Planned ("), "no overlay until a model is named");
    assert!(shows(&h, "Model of this snapshot"));
}

#[test]
fn the_overlay_is_planned_for_the_model_named_for_the_snapshot() {
    let mut h = harness();
    open_doctor(&mut h);
    open_snapshot(&mut h, "normal.snapshot.pickle");
    // A misspelt name: the error names the field and the closest model.
    type_into(&mut h, Role::TextInput, "Model of this snapshot", "gtp2");
    h.get_by_label("Plan this model").click();
    h.run();
    assert!(h.state().doctor.named_plan().is_none());
    assert!(shows(&h, "Model: "), "the error names the field");
    assert!(shows(&h, "gpt2"), "the closest name is offered");
    h.state_mut().doctor.model.clear();
    type_into(&mut h, Role::TextInput, "Model of this snapshot", "gpt2");
    h.get_by_label("Plan this model").click();
    h.run();
    let plan = h.state().doctor.named_plan().expect("planned").clone();
    assert_eq!((plan.model.as_str(), plan.batch), ("gpt2", 8));
    let peak = h
        .state()
        .doctor
        .snapshot()
        .expect("snapshot")
        .peak_allocated_bytes;
    let planned_peak = plan.planned.iter().map(|p| p.1).max().expect("points");
    assert!(
        shows(
            &h,
            &format!(
                "Planned (gpt2 at batch 8, plain loop, named for this snapshot): peak allocated \
                 {} vs {peak}",
                vramlab_core::units::Bytes(planned_peak)
            )
        ),
        "overlay label"
    );
    // Another snapshot: the plan named for the first one is not carried over.
    open_snapshot(&mut h, "fragmentation.snapshot.pickle");
    assert!(h.state().doctor.named_plan().is_none());
    assert!(!shows(&h, "Planned ("));
}

#[test]
fn the_timeline_is_scaled_to_the_data_not_the_card() {
    let mut h = harness();
    open_doctor(&mut h);
    // A 139.80 GiB card's message beside a run that peaked under 3 GiB.
    let text = std::fs::read_to_string(data("capacity.message.txt")).expect("message");
    type_into(&mut h, Role::MultilineTextInput, "OOM message", &text);
    open_snapshot(&mut h, "normal.snapshot.pickle");
    h.run();
    let s = h.state().doctor.snapshot().expect("snapshot");
    let top = s.peak_reserved_bytes.0 as f64 / (1u64 << 30) as f64;
    let (lo, hi) = h.state().doctor.timeline_y_range().expect("plot drawn");
    assert!(lo <= 0.0 && hi >= top, "{lo}..{hi} holds {top}");
    assert!(
        hi < top * 1.5,
        "y runs to {hi} GiB for data up to {top} GiB"
    );
    assert!(shows(&h, "GPU capacity: 139.80 GiB (above the chart)"));
    // A run that fills the card still shows the card's line within the plot.
    let text = std::fs::read_to_string(data("fragmentation.message.txt")).expect("message");
    h.state_mut().doctor.text.clear();
    type_into(&mut h, Role::MultilineTextInput, "OOM message", &text);
    open_snapshot(&mut h, "fragmentation.snapshot.pickle");
    h.run();
    let (_, hi) = h.state().doctor.timeline_y_range().expect("plot drawn");
    assert!((139.0..200.0).contains(&hi), "{hi}");
    assert!(!shows(&h, "(above the chart)"));
}

/// Frames of the Doctor tab with a snapshot's report shown (the largest committed one,
/// 1.2 MB), nothing changing: what a report costs each frame once it is read.
#[test]
#[ignore = "measurement: cargo test --release -p vramlab-gui --test tests -- --ignored --nocapture --test-threads=1 frame_time"]
fn frame_time_with_a_snapshot_open() {
    let mut h = harness();
    open_doctor(&mut h);
    open_snapshot(&mut h, "real_all_eval_unet.snapshot.pickle");
    let (median, p99, max) = crate::gui::frame_times(&mut h, 300, |_, _| ());
    println!(
        "frame time (Doctor tab, real_all_eval_unet snapshot open): median {median:.2} ms, p99 {p99:.2} ms, max {max:.2} ms (300 frames)"
    );
}
