//! Device profile (measured on the GPU): filled in below.
