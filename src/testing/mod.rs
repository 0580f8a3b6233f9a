//! Helpers only the crate's unit tests use.

pub(crate) mod docs;
