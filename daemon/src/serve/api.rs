//! The status page's data, as JSON: environments, deployments, the resource graph and one
//! resource's details, never a secret value.

use std::sync::Arc;

use axum::Router;

use super::Shared;

pub fn routes() -> Router<Arc<Shared>> {
    Router::new()
}
