//! The eframe application (planner GUI).

/// Opens the GUI window.
pub fn run_gui() -> anyhow::Result<()> {
    anyhow::bail!("the GUI is not built yet; use a subcommand (vramlab --help)")
}
