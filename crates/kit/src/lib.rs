//! The small helpers the controller's crates share; the crate imports nothing of ours (only
//! `bounds` builds on `duration`):
//! durations written the human way ([`duration`]) and the range every duration and count flag
//! accepts ([`bounds`]), the one backoff every retry uses ([`backoff`]), per-node identifiers in
//! compact form ([`compact`]) and values many holders share ([`intern`]).
//!
//! Owns: nothing of the domain. Never does I/O.

pub mod backoff;
pub mod bounds;
pub mod compact;
pub mod duration;
pub mod intern;
