//! Where admission's ResourceClaimTemplates are made: the API server ([`KubeTemplates`]) or, in
//! tests, any other [`TemplateStore`].
//!
//! A template's name holds a hash of everything it says
//! ([`carma_api::dra::template::template_name`]), so an existing template of the wanted name is
//! normally the same one, made by an earlier pod or by the operator; it is used only after
//! [`check_existing`] agrees (carma's label, an equal spec). Templates made here have no owner: a
//! pod's UID is not known at admission, and a template outlives any one pod since every pod of the
//! same size shares it. They stay until deleted (one per size and namespace, a few hundred bytes),
//! labelled [`super::LABEL_MADE_BY`]`=`[`super::MADE_BY_ADMISSION`].

use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, PostParams};
use thiserror::Error;

use carma_api::dra::template::{Unusable, check_existing};

/// Why a template could not be provided.
#[derive(Debug, Error)]
pub enum TemplateError {
    /// One of that name exists and must not be used.
    #[error("one of that name exists, but {0}")]
    Unusable(Unusable),
    /// The API server refused or failed.
    #[error("{0}")]
    Api(#[from] kube::Error),
}

/// Makes sure a template exists.
pub trait TemplateStore: Send + Sync + std::fmt::Debug {
    /// Create `template` unless one of its name exists; an existing one must be usable for it.
    fn ensure<'a>(
        &'a self,
        template: &'a ResourceClaimTemplate,
    ) -> BoxFuture<'a, Result<(), TemplateError>>;
}

/// Templates in the cluster, through the extender's client.
#[derive(Clone)]
pub struct KubeTemplates {
    client: kube::Client,
}

impl std::fmt::Debug for KubeTemplates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeTemplates").finish_non_exhaustive()
    }
}

impl KubeTemplates {
    /// Templates written with `client`.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl TemplateStore for KubeTemplates {
    fn ensure<'a>(
        &'a self,
        template: &'a ResourceClaimTemplate,
    ) -> BoxFuture<'a, Result<(), TemplateError>> {
        Box::pin(async move {
            let namespace = template.metadata.namespace.as_deref().unwrap_or_default();
            let name = template.metadata.name.as_deref().unwrap_or_default();
            let api = Api::<ResourceClaimTemplate>::namespaced(self.client.clone(), namespace);
            // Most pods share a template that exists: read first, create only when missing.
            let existing = match api.get_opt(name).await? {
                Some(t) => t,
                None => match api.create(&PostParams::default(), template).await {
                    Ok(_) => return Ok(()),
                    // Another pod of the same size made it in between.
                    Err(kube::Error::Api(s)) if s.code == 409 => api.get(name).await?,
                    Err(e) => return Err(e.into()),
                },
            };
            if existing.metadata.deletion_timestamp.is_some() {
                return Err(TemplateError::Unusable(Unusable::BeingDeleted));
            }
            check_existing(&existing, template).map_err(TemplateError::Unusable)
        })
    }
}
