//! The names, owners and reuse of carma's ResourceClaimTemplates, made by the operator for
//! TrainingTask attempts and by the extender's admission webhook for bare pods.
//!
//! **Names.** A template is named `<readable>-<hash>`: the readable part is
//! [`super::claim_template_name`] (`<class>-g<N>-m<MiB>` or `<class>-g<N>-whole`), the
//! hash is 10 hex digits of FNV-1a over the template's whole spec as JSON (device class, count,
//! capacity, tolerations, the claim's metadata: everything the template says). So a release that
//! changes any of it (say, the taints a whole GPU tolerates) names its templates anew instead of
//! reusing the old ones, and equal bookings of the same release still share one template. Names
//! stay within 63 characters (a DNS label), the readable part shortened when needed.
//!
//! **Reuse.** An existing template of the wanted name is used only if it carries carma's
//! `app.kubernetes.io/managed-by` label and its spec equals the wanted one (quantities compared by
//! value, since the API server rewrites `12288Mi` as `12Gi`); anything else is an error, never
//! reused silently, because its spec is immutable and the pod would get another booking than the
//! one planned.
//!
//! **Lifetime: owner references, not a sweep.** Each template carries a non-controller owner
//! reference to every TrainingTask that used it (the creator sets its own on create; a task that
//! finds the template existing adds its own with a strategic merge patch keyed by uid, which leaves
//! the other owners alone). Kubernetes' garbage collector deletes the template once its last owner
//! is gone, and it re-reads the owners before deleting, so a task that adds itself in time keeps
//! the template alive. The trade-off against a periodic sweep of templates no attempt pod
//! references: a template lives as long as any task that used it *exists*, finished or not (tasks
//! that are kept around keep their templates; each is a few hundred bytes), and templates made
//! before owners were set (the older, size-only names) are not collected. In exchange nothing in
//! the operator decides what is unused: no race between a sweep and a pod about to be created, no
//! grace period, no cluster-wide list, and templates go even when the operator is not running.

use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceClaimTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};

use carma_core::text::{fnv1a, trim_to_dns_end as trim_to};

use crate::names::LABEL_MANAGED_BY;

/// Longest template name: a DNS label, so the name also fits where a label is expected.
pub const MAX_TEMPLATE_NAME: usize = 63;
/// Hex digits of the spec hash in a template name.
const HASH_DIGITS: usize = 10;

/// The name of a template whose readable part is `readable` and whose spec is `spec`:
/// `<readable>-<10 hex digits of the spec's hash>`, at most [`MAX_TEMPLATE_NAME`] characters.
pub fn template_name(
    readable: &str,
    spec: &ResourceClaimTemplateSpec,
) -> Result<String, serde_json::Error> {
    let json = serde_json::to_vec(spec)?;
    let hash = fnv1a(&json) & ((1 << (4 * HASH_DIGITS)) - 1);
    let head = trim_to(readable, MAX_TEMPLATE_NAME - 1 - HASH_DIGITS);
    Ok(format!("{head}-{hash:0width$x}", width = HASH_DIGITS))
}

/// Give `template` its content-derived name; its current name is taken as the readable part.
pub fn name_by_content(template: &mut ResourceClaimTemplate) -> Result<(), serde_json::Error> {
    let readable = template.metadata.name.clone().unwrap_or_default();
    template.metadata.name = Some(template_name(&readable, &template.spec)?);
    Ok(())
}

/// Give `template` its content-derived name ([`name_by_content`]) and `owner` as a
/// non-controller owner: several tasks may own one template, and none controls it.
pub fn finish(
    template: &mut ResourceClaimTemplate,
    mut owner: OwnerReference,
) -> Result<(), serde_json::Error> {
    name_by_content(template)?;
    owner.controller = None;
    owner.block_owner_deletion = None;
    template.metadata.owner_references = Some(vec![owner]);
    Ok(())
}

/// Why an existing template of the wanted name cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unusable {
    /// It lacks carma's managed-by label: someone else's object, which an owner reference would
    /// hand to the garbage collector.
    NotCarmas,
    /// Its spec differs from the wanted one.
    SpecDiffers,
    /// It is being deleted (its last owner went); a later reconcile creates it again.
    BeingDeleted,
}

impl Unusable {
    /// In words, for the error and the Event.
    pub fn as_str(self) -> &'static str {
        match self {
            Unusable::NotCarmas => "it lacks carma's managed-by label",
            Unusable::SpecDiffers => "its spec differs from the one carma wants",
            Unusable::BeingDeleted => "it is being deleted",
        }
    }
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `existing` may stand for `wanted`.
pub fn check_existing(
    existing: &ResourceClaimTemplate,
    wanted: &ResourceClaimTemplate,
) -> Result<(), Unusable> {
    let label = |t: &ResourceClaimTemplate| {
        t.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_MANAGED_BY))
            .cloned()
    };
    if label(existing).is_none() || label(existing) != label(wanted) {
        return Err(Unusable::NotCarmas);
    }
    if !same_spec(&existing.spec, &wanted.spec) {
        return Err(Unusable::SpecDiffers);
    }
    Ok(())
}

/// Whether two template specs say the same: equal JSON, except that strings which are both
/// quantities compare by value (the API server stores quantities in canonical form) and that an
/// empty object, list or `null` is the same as no field (the API server stores the claim's absent
/// `metadata` as `{}`).
pub fn same_spec(a: &ResourceClaimTemplateSpec, b: &ResourceClaimTemplateSpec) -> bool {
    match (serde_json::to_value(a), serde_json::to_value(b)) {
        (Ok(a), Ok(b)) => same_value(&without_empty(a), &without_empty(b)),
        _ => false,
    }
}

/// `v` with every object field whose value is `null`, `{}` or `[]` (once emptied itself) removed.
fn without_empty(v: Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| (k, without_empty(v)))
                .filter(|(_, v)| !is_empty(v))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(without_empty).collect()),
        v => v,
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(o) => o.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(v, w)| same_value(v, w))
        }
        (Value::String(x), Value::String(y)) => {
            x == y || matches!((quantity(x), quantity(y)), (Some(p), Some(q)) if p == q)
        }
        _ => a == b,
    }
}

/// A whole-number quantity (`12Gi`, `12288Mi`, `16G`, `4096`) in its base unit; `None` for
/// anything else (fractions and exponents compare as text).
fn quantity(s: &str) -> Option<u128> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if split == 0 {
        return None;
    }
    let (number, suffix) = s.split_at(split);
    let number: u128 = number.parse().ok()?;
    let unit: u128 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        _ => return None,
    };
    number.checked_mul(unit)
}

/// Whether `template` names the object with uid `uid` among its owners.
pub fn is_owned_by(template: &ResourceClaimTemplate, uid: &str) -> bool {
    template
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid)
}

/// The strategic merge patch that adds `owner` to a template's owners: owner references merge by
/// uid, so the other owners stay.
pub fn add_owner_patch(owner: &OwnerReference) -> Value {
    json!({"metadata": {"ownerReferences": [owner]}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::{GpuBooking, claim_template};
    use k8s_openapi::api::resource::v1::{DeviceToleration, ExactDeviceRequest};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn owner(uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "carma.io/v1alpha1".into(),
            kind: "TrainingTask".into(),
            name: format!("task-{uid}"),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn finished(gpus: u32, booking: GpuBooking) -> ResourceClaimTemplate {
        let mut t = claim_template("ml", "carma-gpu", gpus, booking);
        finish(&mut t, owner("u1")).unwrap();
        t
    }

    fn exact(t: &mut ResourceClaimTemplate) -> &mut ExactDeviceRequest {
        let devices = t.spec.spec.devices.as_mut().unwrap();
        devices.requests.as_mut().unwrap()[0]
            .exactly
            .as_mut()
            .unwrap()
    }

    fn renamed(mut t: ResourceClaimTemplate, f: impl FnOnce(&mut ResourceClaimTemplate)) -> String {
        f(&mut t);
        template_name("carma-gpu-g1-whole", &t.spec).unwrap()
    }

    #[test]
    fn the_name_is_readable_and_stable() {
        let t = finished(1, GpuBooking::Mib(12288));
        let name = t.metadata.name.clone().unwrap();
        let (head, hash) = name.rsplit_once('-').unwrap();
        assert_eq!(head, "carma-gpu-g1-m12288");
        assert_eq!(hash.len(), HASH_DIGITS);
        assert!(hash.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(
            finished(1, GpuBooking::Mib(12288)).metadata.name,
            Some(name)
        );
        // The owner does not enter the name: every task of the same booking shares the template.
        let mut other = claim_template("ml", "carma-gpu", 1, GpuBooking::Mib(12288));
        finish(&mut other, owner("u2")).unwrap();
        assert_eq!(other.metadata.name, t.metadata.name);
    }

    #[test]
    fn the_name_changes_with_every_distinguishing_field() {
        let base = finished(1, GpuBooking::Whole);
        let name = renamed(base.clone(), |_| ());
        let variants = [
            renamed(base.clone(), |t| {
                exact(t).tolerations.as_mut().unwrap().pop();
            }),
            renamed(base.clone(), |t| {
                exact(t)
                    .tolerations
                    .as_mut()
                    .unwrap()
                    .push(DeviceToleration {
                        key: Some("gpu.carma.io/telemetry-stale".into()),
                        operator: Some("Exists".into()),
                        ..DeviceToleration::default()
                    });
            }),
            renamed(base.clone(), |t| {
                exact(t).tolerations.as_mut().unwrap()[0].effect = Some("NoExecute".into());
            }),
            renamed(base.clone(), |t| exact(t).count = Some(2)),
            renamed(base.clone(), |t| {
                exact(t).device_class_name = "other-gpu".into();
            }),
            renamed(base.clone(), |t| {
                exact(t).allocation_mode = Some("All".into());
            }),
            renamed(base.clone(), |t| {
                exact(t).capacity = Some(Default::default());
            }),
        ];
        for (i, v) in variants.iter().enumerate() {
            assert_ne!(*v, name, "variant {i} kept the name");
        }
    }

    #[test]
    fn long_readable_parts_are_cut_to_a_dns_label() {
        let class = "gpus.a-very-long-device-class-name.example.com";
        let mut t = claim_template("ml", class, 8, GpuBooking::Mib(81920));
        finish(&mut t, owner("u1")).unwrap();
        let name = t.metadata.name.unwrap();
        assert!(name.len() <= MAX_TEMPLATE_NAME, "{name}");
        assert!(
            name.starts_with("gpus.a-very-long-device-class-name"),
            "{name}"
        );
        assert!(!name.contains("--") && !name.contains(".-"), "{name}");
    }

    #[test]
    fn owners_are_never_controllers() {
        let t = finished(1, GpuBooking::Mib(100));
        let owners = t.metadata.owner_references.unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].uid, "u1");
        assert_eq!(owners[0].controller, None);
        assert_eq!(owners[0].block_owner_deletion, None);
        let patch = add_owner_patch(&owners[0]);
        assert_eq!(patch["metadata"]["ownerReferences"][0]["uid"], "u1");
    }

    #[test]
    fn an_existing_template_is_used_only_when_it_says_the_same() {
        let wanted = finished(1, GpuBooking::Mib(12288));
        // The API server's canonical quantity is the same booking.
        let mut stored = wanted.clone();
        exact(&mut stored)
            .capacity
            .as_mut()
            .unwrap()
            .requests
            .as_mut()
            .unwrap()
            .insert("memory".into(), Quantity("12Gi".into()));
        assert_eq!(check_existing(&stored, &wanted), Ok(()));
        // So is the claim metadata it stores as `{}` where the operator sent none.
        stored.spec.metadata = Some(Default::default());
        assert_eq!(check_existing(&stored, &wanted), Ok(()));
        let mut labelled = stored.clone();
        labelled.spec.metadata = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            labels: Some([("team".to_string(), "a".to_string())].into()),
            ..Default::default()
        });
        assert_eq!(
            check_existing(&labelled, &wanted),
            Err(Unusable::SpecDiffers)
        );

        let mut bigger = wanted.clone();
        exact(&mut bigger)
            .capacity
            .as_mut()
            .unwrap()
            .requests
            .as_mut()
            .unwrap()
            .insert("memory".into(), Quantity("13Gi".into()));
        assert_eq!(check_existing(&bigger, &wanted), Err(Unusable::SpecDiffers));

        let mut tolerant = wanted.clone();
        exact(&mut tolerant).tolerations = Some(vec![DeviceToleration::default()]);
        assert_eq!(
            check_existing(&tolerant, &wanted),
            Err(Unusable::SpecDiffers)
        );

        let mut foreign = wanted.clone();
        foreign.metadata.labels = None;
        assert_eq!(check_existing(&foreign, &wanted), Err(Unusable::NotCarmas));
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity("12Gi"), quantity("12288Mi"));
        assert_eq!(quantity("16G"), quantity("16000M"));
        assert_eq!(quantity("1024"), quantity("1Ki"));
        assert_ne!(quantity("1G"), quantity("1Gi"));
        assert_eq!(quantity("1.5Gi"), None);
        assert_eq!(quantity("Gi"), None);
        assert_eq!(quantity("carma-gpu"), None);
    }
}
