//! Helpers only the crate's unit tests use.

pub mod docs;
