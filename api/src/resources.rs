//! How many `carma.io/gpu` a container asks for — read the same way by the extender (to place the
//! pod) and the device plugin (to follow kubelet's one Allocate per container).

use k8s_openapi::api::core::v1::Container;

use crate::names::RESOURCE_GPU;

/// The container's `carma.io/gpu`: its limit, else its request, else 0. `Err` carries the value
/// when it is not a whole number of GPUs.
pub fn container_gpus(c: &Container) -> Result<u32, String> {
    let Some(res) = &c.resources else {
        return Ok(0);
    };
    let q = res
        .limits
        .as_ref()
        .and_then(|l| l.get(RESOURCE_GPU))
        .or_else(|| res.requests.as_ref().and_then(|r| r.get(RESOURCE_GPU)));
    match q {
        None => Ok(0),
        Some(q) => q.0.trim().parse::<u32>().map_err(|_| q.0.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_then_request_then_zero() {
        let c: Container = serde_json::from_value(serde_json::json!({"name": "t",
            "resources": {"limits": {"carma.io/gpu": "2"}, "requests": {"carma.io/gpu": "1"}}}))
        .unwrap();
        assert_eq!(container_gpus(&c), Ok(2));
        let c: Container = serde_json::from_value(serde_json::json!({"name": "t",
            "resources": {"requests": {"carma.io/gpu": "1"}}}))
        .unwrap();
        assert_eq!(container_gpus(&c), Ok(1));
        let c: Container = serde_json::from_value(serde_json::json!({"name": "t"})).unwrap();
        assert_eq!(container_gpus(&c), Ok(0));
        let c: Container = serde_json::from_value(serde_json::json!({"name": "t",
            "resources": {"limits": {"carma.io/gpu": "500m"}}}))
        .unwrap();
        assert_eq!(container_gpus(&c), Err("500m".to_string()));
    }
}
