//! The `DevicePlugin` gRPC service kubelet calls on the plugin's socket.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::{debug, info, instrument};

use crate::allocate::Allocator;
use crate::proto::device_plugin_server::DevicePlugin;
use crate::proto::{
    AllocateRequest, AllocateResponse, Device, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse,
};

/// The options carma announces: no PreStartContainer, GetPreferredAllocation available.
pub fn plugin_options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// The service of one serving generation (a new one each time the socket is re-created).
#[derive(Debug, Clone)]
pub struct DevicePluginService {
    devices: watch::Receiver<Vec<Device>>,
    allocator: Arc<Allocator>,
    /// Turns true when this generation stops: open ListAndWatch streams then end, so the server can
    /// shut down gracefully.
    stop: watch::Receiver<bool>,
}

impl DevicePluginService {
    /// A service advertising `devices` (updated through the channel) and allocating with `allocator`.
    pub fn new(
        devices: watch::Receiver<Vec<Device>>,
        allocator: Arc<Allocator>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self {
            devices,
            allocator,
            stop,
        }
    }
}

type ListStream =
    Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(plugin_options()))
    }

    type ListAndWatchStream = ListStream;

    async fn list_and_watch(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        info!("kubelet opened ListAndWatch");
        // The full list at once, then again on every change; ends when this generation stops.
        let state = (self.devices.clone(), self.stop.clone(), true);
        let stream = futures::stream::unfold(state, |(mut devices, mut stop, first)| async move {
            if !first {
                tokio::select! {
                    changed = devices.changed() => changed.ok()?,
                    _ = crate::stopped(&mut stop) => return None,
                }
            }
            if *stop.borrow() {
                return None;
            }
            let list = devices.borrow_and_update().clone();
            debug!(
                devices = list.len(),
                "ListAndWatch: sending the device list"
            );
            Some((
                Ok(ListAndWatchResponse { devices: list }),
                (devices, stop, false),
            ))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    #[instrument(skip_all, fields(containers = request.get_ref().container_requests.len()))]
    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        Ok(Response::new(
            self.allocator.preferred(request.into_inner()).await,
        ))
    }

    #[instrument(skip_all, fields(containers = request.get_ref().container_requests.len()))]
    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        self.allocator
            .allocate(request.into_inner())
            .await
            .map(Response::new)
            .map_err(Status::failed_precondition)
    }

    async fn pre_start_container(
        &self,
        _request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
