//! The pure logic of ec2-topology-labeler, apart from all I/O: what a providerID names, which
//! labels a topology answer means, what must change on a node, and the topology tree the labels
//! describe. Small and dependency-light, so it is unit-, property- and fuzz-tested on its own.

pub mod consistent;
pub mod coverage;
pub mod fit;
pub mod labels;
pub mod picture;
pub mod provider_id;
pub mod reservations;
pub mod slurm;
pub mod state;
pub mod topology;
pub mod tree;
pub mod verified;
pub mod vouch;
