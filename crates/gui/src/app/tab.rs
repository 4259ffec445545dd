//! The app's pages.

/// The app's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tab {
    #[default]
    Planner,
    Run,
    Monitor,
    Doctor,
}

impl Tab {
    pub const ALL: [Tab; 4] = [Tab::Planner, Tab::Run, Tab::Monitor, Tab::Doctor];

    pub fn label(self) -> &'static str {
        match self {
            Tab::Planner => "Planner",
            Tab::Run => "Run",
            Tab::Monitor => "Monitor",
            Tab::Doctor => "Doctor",
        }
    }
}
