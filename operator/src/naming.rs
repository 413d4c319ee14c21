//! What the names the operator makes (attempt pods, task labels, claim templates) are built
//! from when a readable name is too long for Kubernetes: a stable hash of the whole, and the
//! readable head cut to what is left.

pub(crate) use carma_core::text::{fnv1a, trim_to_dns_end as trim_to};
