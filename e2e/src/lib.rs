//! `carma-e2e`: carma's whole-system tests that run without a cluster.
//!
//! The library is empty on purpose; the tests live in `tests/`:
//!
//! * `tests/oom_recovery.rs` — a `TrainingTask` from submission through a CUDA
//!   out-of-memory crash to a successful recovery, and the escalation to an
//!   exclusive GPU after repeated crashes. Every part runs its real code: the
//!   operator's planner (`carma_operator::plan`), the scheduler extender's
//!   filter / prioritize / bind (`carma_scheduler_extender::Extender`, fed
//!   kube-scheduler-shaped JSON), and the device plugin's simulated GPUs,
//!   telemetry and Allocate (`carma_device_plugin`). Only the Kubernetes API
//!   server, kube-scheduler's own loop and kubelet are stood in for, by a small
//!   in-memory object store in `tests/harness/`.
//!
//! The scripts for a real kind cluster are in `e2e/kind/` (see `e2e/README.md`).
