//! [`Parse`]: a core type read from the word a user typed — the trait the core's types
//! implement here instead of `FromStr` (the core reads no word), and [`parse`], its call.

/// A typed value read from the word a user typed: canonical names, the aliases users write,
/// and an error that names the setting (with the closest valid value where there is one).
pub trait Parse: Sized {
    /// What a word that does not read as `Self` gives.
    type Err;
    /// Reads `s`.
    fn parse_word(s: &str) -> Result<Self, Self::Err>;
}

/// `s` read as a `T`: `vramlab_words::parse::<Strategy>("zero2")`, as `str::parse` reads a
/// type with `FromStr`.
pub fn parse<T: Parse>(s: &str) -> Result<T, T::Err> {
    T::parse_word(s)
}
