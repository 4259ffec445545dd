//! The GUI's tests through egui_kittest: the planner and run panels, snapshots and the
//! screenshots in the repository's `screenshots/`. One test binary, linked once.

mod doctor;
mod gui;
mod gui_fit;
mod gui_follow;
mod gui_hf;
mod gui_hub;
mod gui_infer;
mod gui_run;
mod gui_warnings;
