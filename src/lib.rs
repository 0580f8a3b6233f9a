//! ec2-topology-labeler: keeps Kubernetes node labels in step with EC2 network topology.
//!
//! Pure logic ([`provider_id`], [`labels`], [`tree`], [`state`]: the `ec2-topology-core`
//! crate) and the EC2 lookup ([`lookup`]: the `ec2-topology-lookup` crate, no Kubernetes) are
//! kept apart from the controller. The rooms here: [`cmd`] (every command; [`cmd::run`] wires
//! the controller), [`flags`] (the command line), [`node`] (the node model, its watch and cache),
//! [`reconcile`] (decide and write a node's labels), [`publish`] (scheduler objects),
//! [`cleanup`] (what we remove), [`leader`], [`ledger`] (the verification records), [`client`], [`tasks`], [`metrics`] and [`admin`]
//! (the HTTP endpoints and Events). docs/architecture.md draws them and their order.

// An item is `pub(crate)` unless the binary, the tests or the e2e suite use it from outside:
// `pub` on an item no other crate can reach is refused (with clippy's `-D warnings`).
#![warn(unreachable_pub)]

pub(crate) mod admin;
pub(crate) mod cleanup;
pub(crate) mod client;
pub mod cmd;
pub mod flags;
pub mod leader;
pub mod ledger;
pub mod metrics;
pub mod node;
pub mod publish;
pub mod reconcile;
pub(crate) mod tasks;
#[cfg(test)]
mod testing;

pub use ec2_topology_core::{
    consistent, coverage, fit, labels, picture, provider_id, reservations, slurm, state, topology,
    tree, verified, vouch,
};
pub use ec2_topology_kit::{backoff, bounds, compact, duration, intern};
/// Where EC2 is asked: its own crate, with no Kubernetes dependency.
pub use ec2_topology_lookup as lookup;
use topology::Ec2Error;

/// Field manager of every write we make. Never rename it: server-side apply ownership is
/// recorded under this name, and a new name would strand the labels owned by the old one.
pub const FIELD_MANAGER: &str = "ec2-topology-labeler";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Ec2(#[from] Ec2Error),
    #[error("Kubernetes API: {0}")]
    Kube(#[source] kube::Error),
    #[error("configuration: {0}")]
    Config(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Self {
        Error::Kube(e)
    }
}

impl Error {
    /// Every category a reconcile error is counted under: [`Error::category`]'s values and
    /// `invalid_topology` (an EC2 answer that cannot be turned into labels).
    pub(crate) const CATEGORIES: [&'static str; 17] = [
        "ec2_throttled",
        "ec2_unauthorized",
        "ec2_unsupported_operation",
        "ec2_invalid_request",
        "ec2_service",
        "ec2_timeout",
        "ec2_transport",
        "ec2_bad_response",
        "no_region",
        "kube_forbidden",
        "kube_conflict",
        "kube_fenced",
        "kube_timeout",
        "kube",
        "config",
        "io",
        // Recorded by the reconcile for an EC2 answer that cannot be turned into labels.
        "invalid_topology",
    ];

    /// Stable category, used as a metric label.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Ec2(e) => match e {
                Ec2Error::Throttled { .. } => "ec2_throttled",
                Ec2Error::Unauthorized { .. } => "ec2_unauthorized",
                Ec2Error::UnsupportedOperation { .. } => "ec2_unsupported_operation",
                Ec2Error::InvalidRequest { .. } => "ec2_invalid_request",
                Ec2Error::Service { .. } => "ec2_service",
                Ec2Error::Timeout(_) => "ec2_timeout",
                Ec2Error::Transport(_) => "ec2_transport",
                Ec2Error::BadResponse(_) => "ec2_bad_response",
                Ec2Error::NoRegion => "no_region",
            },
            Error::Kube(kube::Error::Api(s)) if s.code == 403 => "kube_forbidden",
            Error::Kube(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => "kube_conflict",
            Error::Kube(e) => match client::Cut::of(e) {
                Some(cut) if cut.is_fenced() => "kube_fenced",
                Some(_) => "kube_timeout",
                None => "kube",
            },
            Error::Config(_) => "config",
            Error::Io(_) => "io",
        }
    }

    /// The API server did not take the request at all (unreachable, overloaded, restarting, or
    /// refusing our credentials): worth re-checking every node once it works again. A 404 or
    /// 409 is about one node (deleted or changed meanwhile), not about the API server.
    pub(crate) fn is_api_unavailable(&self) -> bool {
        match self {
            Error::Kube(kube::Error::Api(s)) => {
                s.code >= 500 || s.code == 429 || s.code == 401 || s.code == 403
            }
            // A write fenced by the lease is about this replica, not the API server (the
            // next leader re-checks every node).
            Error::Kube(e) => !client::Cut::of(e).is_some_and(client::Cut::is_fenced),
            _ => false,
        }
    }

    /// Errors an operator must fix; retrying soon will not help.
    pub(crate) fn needs_operator(&self) -> bool {
        match self {
            Error::Ec2(e) => e.needs_operator(),
            Error::Kube(kube::Error::Api(s)) => s.code == 403,
            Error::Config(_) => true,
            _ => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
