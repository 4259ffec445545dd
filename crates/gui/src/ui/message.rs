//! The status line panels show after an action (saved, opened, failed).

/// A status line shown under the preset buttons (save/open results).
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub text: String,
    pub is_error: bool,
}
