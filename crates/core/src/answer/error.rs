//! The error every front end shows for an answer it could not give ([`AnswerError`]: a
//! message with its causes, and whether a file could not be read), and [`Ctx`], which turns
//! any error into one.

use std::fmt::Display;

/// What a front end shows when an answer cannot be given: one message, causes joined with
/// `: ` as the CLI prints an error chain (words that did not resolve name the setting and,
/// where there is one, the closest valid value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AnswerError {
    message: String,
    /// A file could not be read (the bindings raise `OSError` for it).
    pub file: bool,
}

impl AnswerError {
    pub fn new(message: impl Into<String>) -> AnswerError {
        AnswerError {
            message: message.into(),
            file: false,
        }
    }

    /// The message with its causes.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// `e` and its causes joined with `: ` (as `{:#}` of an error chain prints them).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// Turns any error into a [`AnswerError`], with a context in front.
pub trait Ctx<T> {
    fn plain(self) -> Result<T, AnswerError>;
    fn ctx(self, context: impl Display) -> Result<T, AnswerError>;
}

impl<T, E: std::error::Error + 'static> Ctx<T> for Result<T, E> {
    fn plain(self) -> Result<T, AnswerError> {
        self.map_err(|e| {
            let file = (&e as &dyn std::error::Error)
                .downcast_ref::<crate::fsutil::ReadError>()
                .is_some()
                || (&e as &dyn std::error::Error)
                    .downcast_ref::<AnswerError>()
                    .is_some_and(|w| w.file);
            AnswerError {
                message: chain(&e),
                file,
            }
        })
    }

    fn ctx(self, context: impl Display) -> Result<T, AnswerError> {
        self.plain().map_err(|e| AnswerError {
            message: format!("{context}: {}", e.message),
            file: e.file,
        })
    }
}
