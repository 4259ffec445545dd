//! What the command line says on standard error besides its errors: notes (an alias read
//! as a canonical name, a fallback) and the core's remarks as they are made.

use vramlab_words::train_words::Remark;

/// Prints a note on standard error.
pub(crate) fn note(text: &str) {
    eprintln!("note: {text}");
}

/// Prints the core's remarks on standard error, as they are made.
pub(crate) fn say(r: Remark) {
    match r {
        Remark::Note(n) => note(&n),
        Remark::Warning(w) => eprintln!("warning: {w}"),
    }
}
