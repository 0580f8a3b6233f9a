//! Helpers only the crate's unit tests use: the generated parts of the docs, and the one node
//! builder.

pub(crate) mod docs;
pub(crate) mod nodes;
