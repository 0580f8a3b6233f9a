//! What operators read from outside the reconcile: the admin HTTP servers ([`http`]: metrics,
//! probes and the loopback node view, [`view`]), Kubernetes Events ([`events`]) and the
//! process's own identity and resource use ([`process`]).
//!
//! Owns: those outputs. Never changes what the controller decides or writes to a Node.

pub mod events;
pub mod http;
pub mod process;
pub mod view;
