//! The kubelet device-plugin API v1beta1, generated at build time from `proto/api.proto`.

#![allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]

/// Messages and services of package `v1beta1`.
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

pub use v1beta1::*;

/// API version sent in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";
/// Kubelet's registration socket, in the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// Health string of a usable device.
pub const HEALTHY: &str = "Healthy";
/// Health string of an unusable device.
pub const UNHEALTHY: &str = "Unhealthy";
