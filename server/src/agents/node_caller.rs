//! The `NodeCaller` extractor: an agent authenticated by its node credential. Users' keys and
//! sessions are never accepted here, and node credentials are never accepted elsewhere. Any
//! request a node makes proves it alive, not only its polls: an agent busy reporting starts
//! and ends (slowly, in a burst) between two polls is not judged lost for it.

use std::future::Future;
use std::pin::Pin;

use actix_web::{web, FromRequest, HttpRequest};

use super::NODE_CREDENTIAL_PREFIX;
use crate::auth::secrets::digest;
use crate::domain::NodeStatus;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::NodeRecord;

pub struct NodeCaller {
    pub node: NodeRecord,
}

impl FromRequest for NodeCaller {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<NodeCaller, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            let state = req
                .app_data::<web::Data<AppState>>()
                .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("app state missing")))?;
            let token = crate::auth::bearer::bearer_token(req.headers())
                .filter(|t| t.starts_with(NODE_CREDENTIAL_PREFIX))
                .ok_or_else(|| {
                    ApiError::Unauthorized("agents authenticate with their node credential".into())
                })?;
            let node = state
                .scheduler
                .node_by_credential(state.store.as_ref(), &digest(token))
                .await?
                .ok_or_else(|| {
                    ApiError::Unauthorized("unknown or revoked node credential".into())
                })?;
            if node.status != NodeStatus::Lost {
                // A lost node comes back by its poll, which writes its time at once.
                state.agents.presence.heard(
                    &node,
                    state.clock.now_ms(),
                    state.settings.node_lost_timeout_secs,
                );
            }
            Ok(NodeCaller { node })
        })
    }
}
