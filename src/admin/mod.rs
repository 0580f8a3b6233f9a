//! What operators read from outside the reconcile: the admin HTTP servers ([`http`]: metrics,
//! probes and, on loopback, the controller's view of a node) and Kubernetes Events
//! ([`events`]).
//!
//! Owns: those outputs. Never changes what the controller decides or writes to a Node.

pub(crate) mod events;
pub(crate) mod http;
