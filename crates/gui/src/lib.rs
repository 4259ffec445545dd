//! vramlab's desktop app: the planner, run and monitor panels ([`ui`]) and the eframe app
//! that owns dialogs, files and background workers ([`app`]). Panels draw state and return
//! commands; the app applies them once per frame.

pub mod app;
pub mod ui;

pub use app::run_gui;
