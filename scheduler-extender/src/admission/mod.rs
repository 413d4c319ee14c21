//! Mutating admission of bare pods on the DRA path: a pod created with the `carma.io/gpu` extended
//! resource takes its GPUs from a ResourceClaimTemplate sized by the extender's own decision.
//!
//! On DRA nodes nothing advertises `carma.io/gpu`, and a claim's size cannot change after its pod
//! is created (`spec.resourceClaims` is immutable), so the size is decided here, at creation, with
//! exactly the rule the extender applies at bind on the device-plugin path
//! ([`crate::Decisions::compute`]: the `carma.io/gpu-memory` override, the learned reservation
//! of the model profile, the estimate, else the whole GPU). The pod then loses its `carma.io/gpu`
//! requests and references a claim made from the template `<class>-g<N>-m<MiB>-<hash>` (or
//! `…-whole-<hash>`), which is created here when missing ([`templates`]). kube-scheduler's own DRA
//! allocator places the claim on carma's ResourceSlices; the extender is not called for it.
//!
//! What is left alone (admitted unchanged): anything but a pod creation, a pod that asks for no
//! `carma.io/gpu`, and a pod that names its node (the chart's validating policy refuses that one,
//! since no scheduler would see it). What is refused, with the reason: a pod carma cannot judge (a
//! malformed annotation or GPU count), a pod that already has a claim entry named `carma-gpu`, and
//! a template that cannot be created or is not carma's. Refusing at creation shows the reason to
//! whoever creates the pod; admitting it unchanged would leave it Pending on DRA nodes with nothing
//! saying why.

pub mod templates;

use std::collections::BTreeMap;
use std::sync::Arc;

use carma_api::EstimateAnnotation;
use carma_api::dra::template::name_by_content;
use carma_api::dra::{CLAIM_NAME, GpuBooking, claim_template, move_gpus_to_claim};
use carma_api::names::{ANNOTATION_ESTIMATE, ANNOTATION_EXCLUSIVE};
use carma_core::Reservation;
use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};

use crate::pod_decision::{Decision, Decisions, gpu_request};
pub use templates::{KubeTemplates, TemplateError, TemplateStore};

/// The label on templates made here, so that they can be told from the operator's and removed.
pub const LABEL_MADE_BY: &str = "carma.io/made-by";
/// [`LABEL_MADE_BY`]'s value on templates made by admission.
pub const MADE_BY_ADMISSION: &str = "admission";

/// What admission did with one pod, for the metrics and the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionOutcome {
    /// The pod now takes its GPUs from a claim.
    Claimed,
    /// Nothing to do: not a pod creation, no `carma.io/gpu`, or bound at creation.
    Unchanged,
    /// Refused, with the reason in the answer.
    Refused,
}

impl AdmissionOutcome {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionOutcome::Claimed => "claimed",
            AdmissionOutcome::Unchanged => "unchanged",
            AdmissionOutcome::Refused => "refused",
        }
    }
}

/// The answer to one admission request and what it did.
#[derive(Debug)]
pub struct Admitted {
    /// The answer for the API server.
    pub response: AdmissionResponse,
    /// What was done.
    pub outcome: AdmissionOutcome,
    /// Where the claim's size came from (`override`, an estimator source, `history`, `whole-gpu`),
    /// for a pod given a claim.
    pub source: Option<String>,
}

/// Gives bare pods that ask for `carma.io/gpu` a sized DRA claim instead.
#[derive(Debug, Clone)]
pub struct BarePodClaims {
    device_class: String,
    templates: Arc<dyn TemplateStore>,
}

impl BarePodClaims {
    /// Claims of `device_class`, templates written through `templates`.
    pub fn new(device_class: impl Into<String>, templates: Arc<dyn TemplateStore>) -> Self {
        Self {
            device_class: device_class.into(),
            templates,
        }
    }

    /// The answer to one admission request, and what it did.
    #[tracing::instrument(skip_all, fields(pod = %pod_name(request), outcome))]
    pub async fn admit(&self, decisions: &Decisions, request: &AdmissionRequest<Pod>) -> Admitted {
        let allow = AdmissionResponse::from(request);
        let mut source = None;
        let (response, outcome) = match self.plan(decisions, request) {
            Ok(None) => (allow, AdmissionOutcome::Unchanged),
            Ok(Some(plan)) => {
                source = Some(plan.decision.source.clone());
                match self.apply(request, plan).await {
                    Ok(answer) => (answer, AdmissionOutcome::Claimed),
                    Err(reason) => (allow.deny(reason), AdmissionOutcome::Refused),
                }
            }
            Err(reason) => (allow.deny(reason), AdmissionOutcome::Refused),
        };
        tracing::Span::current().record("outcome", outcome.as_str());
        if outcome == AdmissionOutcome::Refused {
            tracing::info!(reason = %response.result.message, "refused a pod at admission");
            source = None;
        }
        Admitted {
            response,
            outcome,
            source,
        }
    }

    /// What to do with the pod: `None` leaves it unchanged.
    fn plan(
        &self,
        decisions: &Decisions,
        request: &AdmissionRequest<Pod>,
    ) -> Result<Option<Plan>, String> {
        if request.operation != Operation::Create || request.kind.kind != "Pod" {
            return Ok(None);
        }
        let Some(pod) = &request.object else {
            return Ok(None);
        };
        let Some(spec) = &pod.spec else {
            return Ok(None);
        };
        if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
            return Ok(None);
        }
        let gpus = gpu_request(pod).map_err(|e| e.to_string())?;
        if gpus == 0 {
            return Ok(None);
        }
        if spec
            .resource_claims
            .iter()
            .flatten()
            .any(|c| c.name == CLAIM_NAME)
        {
            return Err(format!(
                "the pod asks for carma.io/gpu and already has a resource claim named \
                 {CLAIM_NAME:?}; keep one of them"
            ));
        }
        let decision = decisions.compute(pod).map_err(|e| e.to_string())?;
        Ok(Some(Plan {
            gpus,
            booking: booking(&decision),
            decision,
        }))
    }

    /// Ensure the plan's template exists (not on a dry run) and answer with the patch to the pod.
    async fn apply(
        &self,
        request: &AdmissionRequest<Pod>,
        plan: Plan,
    ) -> Result<AdmissionResponse, String> {
        let pod = request.object.as_ref().ok_or("the request has no pod")?;
        let namespace = request
            .namespace
            .clone()
            .or_else(|| pod.metadata.namespace.clone())
            .ok_or("the request names no namespace")?;
        let mut template = claim_template(&namespace, &self.device_class, plan.gpus, plan.booking);
        name_by_content(&mut template).map_err(|e| format!("naming the claim template: {e}"))?;
        template
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(LABEL_MADE_BY.to_string(), MADE_BY_ADMISSION.to_string());
        let name = template.metadata.name.clone().unwrap_or_default();
        if !request.dry_run {
            self.templates.ensure(&template).await.map_err(|e| {
                format!("carma could not provide the ResourceClaimTemplate {namespace}/{name}: {e}")
            })?;
        }
        let mut claimed = pod.clone();
        let spec = claimed.spec.as_mut().ok_or("the pod has no spec")?;
        move_gpus_to_claim(spec, &name);
        let annotations = claimed
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new);
        let summary = match plan.booking {
            GpuBooking::Mib(mib) => {
                let estimate = EstimateAnnotation {
                    mib,
                    source: plan.decision.source.clone(),
                    class: plan.decision.class.clone(),
                    samples: plan.decision.samples,
                };
                let json = serde_json::to_string(&estimate)
                    .map_err(|e| format!("writing {ANNOTATION_ESTIMATE}: {e}"))?;
                annotations.insert(ANNOTATION_ESTIMATE.to_string(), json);
                format!("{mib} MiB on each GPU ({})", plan.decision.source)
            }
            GpuBooking::Whole => {
                annotations.insert(ANNOTATION_EXCLUSIVE.to_string(), "true".to_string());
                format!("whole GPUs ({})", plan.decision.source)
            }
        };
        let before = serde_json::to_value(pod).map_err(|e| e.to_string())?;
        let after = serde_json::to_value(&claimed).map_err(|e| e.to_string())?;
        let mut answer = AdmissionResponse::from(request)
            .with_patch(json_patch::diff(&before, &after))
            .map_err(|e| e.to_string())?;
        answer.warnings = Some(vec![format!(
            "carma: carma.io/gpu replaced by a claim from ResourceClaimTemplate {name}: {} GPU(s), {summary}",
            plan.gpus
        )]);
        Ok(answer)
    }
}

/// The size a plan books.
#[derive(Debug)]
struct Plan {
    gpus: u32,
    booking: GpuBooking,
    decision: Decision,
}

/// What a claim books for `decision`. A claim must name a size, so a pod the device-plugin path
/// would share without one (`Reservation::Unknown`, CARMA's OR variants) takes whole GPUs here,
/// as does an exclusive pod.
pub fn booking(decision: &Decision) -> GpuBooking {
    match decision.demand.reservation {
        Reservation::Mib(mib) if !decision.demand.exclusive => GpuBooking::Mib(mib),
        _ => GpuBooking::Whole,
    }
}

fn pod_name(request: &AdmissionRequest<Pod>) -> String {
    let name = request
        .object
        .as_ref()
        .and_then(|p| p.metadata.name.clone().or(p.metadata.generate_name.clone()))
        .unwrap_or_else(|| request.name.clone());
    format!("{}/{name}", request.namespace.as_deref().unwrap_or(""))
}
