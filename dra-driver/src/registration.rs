//! The `pluginregistration.Registration` service on the registration socket.
//!
//! The kubelet's plugin watcher finds the socket in its registry directory, calls `GetInfo`,
//! validates the answer (type `DRAPlugin`, a version it speaks), connects to the endpoint named
//! there and reports the outcome through `NotifyRegistrationStatus`. Unlike the device-plugin API
//! nothing has to be redone when the kubelet restarts: the watcher re-reads the sockets it finds.
//! The watcher's requests carry an `:authority` tonic rejects; the socket is therefore served
//! through [`crate::server::serve_unix_fixing_authority`].

use std::path::Path;

use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::{error, info, instrument};

use crate::DRIVER_NAME;
use crate::proto::registration::registration_server::Registration;
use crate::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use crate::proto::{PLUGIN_TYPE, SUPPORTED_VERSIONS};

/// What the kubelet last said about the registration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RegistrationState {
    /// Nothing yet.
    #[default]
    Pending,
    /// The kubelet registered the plugin.
    Registered,
    /// The kubelet refused it, with its reason.
    Failed(String),
}

/// The registration service.
#[derive(Debug)]
pub struct RegistrationService {
    info: PluginInfo,
    state: watch::Sender<RegistrationState>,
}

impl RegistrationService {
    /// A service announcing the DRA service at `endpoint` (an absolute socket path: the kubelet
    /// dials exactly what it is given). The receiver follows the kubelet's verdicts.
    pub fn new(endpoint: &Path) -> (Self, watch::Receiver<RegistrationState>) {
        let (state, rx) = watch::channel(RegistrationState::Pending);
        let info = PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: DRIVER_NAME.to_string(),
            endpoint: endpoint.to_string_lossy().into_owned(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        };
        (Self { info, state }, rx)
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    #[instrument(name = "GetInfo", skip_all)]
    async fn get_info(
        &self,
        _request: Request<InfoRequest>,
    ) -> Result<Response<PluginInfo>, Status> {
        info!(endpoint = %self.info.endpoint, "kubelet asked for the plugin info");
        Ok(Response::new(self.info.clone()))
    }

    #[instrument(name = "NotifyRegistrationStatus", skip_all, fields(registered = request.get_ref().plugin_registered))]
    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let state = if status.plugin_registered {
            info!("kubelet registered the DRA driver");
            RegistrationState::Registered
        } else {
            error!(reason = %status.error, "kubelet refused the DRA driver");
            RegistrationState::Failed(status.error)
        };
        self.state.send_replace(state);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
