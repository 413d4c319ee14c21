//! The kubelet's plugin-registration API (`pluginregistration`, v1) and DRA node API
//! (`k8s.io.kubelet.pkg.apis.dra.v1`), generated at build time from `proto/`.

#![allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]

/// Messages and service of package `pluginregistration` (the kubelet's plugin watcher).
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// Messages and service of package `k8s.io.kubelet.pkg.apis.dra.v1`.
pub mod dra {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `PluginInfo.type` of a DRA kubelet plugin (`DRAPlugin` in `pluginregistration/v1/constants.go`).
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The gRPC services advertised in `PluginInfo.supported_versions`: the kubelet picks the first
/// one it knows. 1.35, 1.36 and 1.37 all know `v1.DRAPlugin`.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["v1.DRAPlugin"];
