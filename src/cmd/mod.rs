//! The operator's commands besides `run` (which is the controller, [`crate::cmd::run`]): each a thin
//! file over the library that reads the cluster (and EC2), prints, and writes nothing but what
//! `uninstall` and `retire` are for. No command imports another.

pub mod explain;
pub mod fit;
pub mod plan;
pub mod retire;
pub mod run;
pub mod tree;
pub mod uninstall;
