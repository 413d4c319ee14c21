//! `carma-gpu`: the GPU layer that carma's node agents share — the device plugin
//! (`carma-device-plugin`), the DRA driver (`carma-dra-driver`) and `carma local`.
//!
//! * samples the GPUs through one of three [`backends`] (NVML, DCGM via dcgm-exporter,
//!   simulated), opened from the agents' [`BackendSettings`] by [`backends::open_backend`]
//!   ([`config`] holds the flag values' types and parsers, [`parse_duration`] among them);
//! * keeps CARMA's telemetry windows per GPU and metric ([`windows`]) and reduces them to risk
//!   scores, the utilization gate's verdict and a node [`telemetry::Snapshot`] ([`telemetry`],
//!   using `carma-core`), attributing GPU memory to the pods on the node ([`pod`], [`cgroup`]);
//! * says what a GPU container gets ([`container`]: `NVIDIA_VISIBLE_DEVICES`,
//!   `CARMA_RESERVED_MIB`, the memory request and limit, MPS), as CDI specs where a spec is written
//!   ([`cdi`]), and whether NVIDIA's memory-limit hook runs ([`enforcement`]);
//! * runs one telemetry step the way both Kubernetes agents do ([`sampling`]);
//! * reaches gRPC services over Unix sockets ([`uds`]).
//!
//! It writes nothing to Kubernetes: publishing a `GpuNode` (the device plugin) or a ResourceSlice
//! (the DRA driver) stays with the agent. The types it reads and builds are `carma-api`'s (the
//! extender's `Assignment` annotation on a pod, the `GpuNode` status a snapshot turns into, the
//! environment variable names). Only the `kube` feature (on by default) brings in kube-rs and
//! `k8s-openapi`, to read a pod from a `k8s-openapi` `Pod` ([`pod::PodInfo::from_pod`]);
//! `carma local` builds without it.

pub mod backends;
pub mod cdi;
pub mod cgroup;
pub mod config;
pub mod container;
pub mod enforcement;
#[cfg(any(test, feature = "test-fixtures"))]
pub mod fixtures;
pub mod pod;
pub mod sampling;
pub mod telemetry;
pub mod uds;
pub mod windows;

pub use config::{
    BackendKind, BackendSettings, ConfigError, MpsConfig, SimulatedGpus, SimulatedMetrics,
    parse_duration, parse_duration_up_to,
};
