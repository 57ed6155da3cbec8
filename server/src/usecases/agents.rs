//! How a GPU host joins: its agent presents a registration token once and gets a credential
//! of its own; what it says about the node (GPUs, CPU, memory, how it isolates tasks, which
//! dataset folders it shares) is checked here before the scheduler relies on it.

use std::collections::HashSet;

use autodl_common::agent::{AgentHost, RegisterRequest, RegisterResponse};
use autodl_scheduler::Gpu;

use crate::agents::{NODE_CREDENTIAL_PREFIX, REGISTRATION_TOKEN_PREFIX};
use crate::auth::secrets::{digest, new_id, random_hex};
use crate::auth::Caller;
use crate::domain::{parse_node_id, NodeStatus};
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{HostDetail, NodeHost, NodeRecord, Nodes, RegistrationTokenRecord, StoreResult};
use crate::tasks::access::{self, Isolation};

/// What a new registration token allows.
pub struct TokenGrant {
    pub name: String,
    pub created_by: String,
    /// Only this node may register with it (and take the node over if it exists).
    pub node_id: Option<String>,
    pub max_uses: u32,
    pub valid_ms: i64,
}

/// Makes a registration token: only its digest is stored, the token itself is returned once.
pub async fn issue_registration_token(
    store: &dyn Nodes,
    grant: TokenGrant,
    now: i64,
) -> StoreResult<(String, RegistrationTokenRecord)> {
    let token = format!("{REGISTRATION_TOKEN_PREFIX}{}", random_hex(24));
    let rec = RegistrationTokenRecord {
        id: new_id(),
        name: grant.name,
        token_hash: digest(&token),
        created_by: grant.created_by,
        created_at: now,
        expires_at: now + grant.valid_ms,
        revoked: false,
        max_uses: i64::from(grant.max_uses),
        uses: 0,
        node_id: grant.node_id,
    };
    store.create_registration_token(&rec).await?;
    Ok((token, rec))
}

/// A platform administrator makes a registration token (see [`issue_registration_token`]).
pub async fn grant_registration_token(
    state: &AppState,
    caller: &Caller,
    grant: TokenGrant,
) -> Result<(String, RegistrationTokenRecord), ApiError> {
    caller.require_platform_admin()?;
    Ok(issue_registration_token(state.store.as_ref(), grant, state.clock.now_ms()).await?)
}

pub async fn registration_tokens(
    state: &AppState,
    caller: &Caller,
) -> Result<Vec<RegistrationTokenRecord>, ApiError> {
    caller.require_platform_admin()?;
    Ok(state.store.list_registration_tokens().await?)
}

/// Revokes a registration token: nobody joins with it any more (nodes that joined stay).
pub async fn revoke_registration_token(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<(), ApiError> {
    caller.require_platform_admin()?;
    if state.store.revoke_registration_token(id).await? {
        Ok(())
    } else {
        Err(ApiError::NotFound("no such registration token".into()))
    }
}

/// Registers (or, with a token made for it, re-registers) the node and hands its agent a new
/// credential. The token is counted only once everything else is valid.
pub async fn register(
    state: &AppState,
    req: &RegisterRequest,
) -> Result<RegisterResponse, ApiError> {
    let now = state.clock.now_ms();
    let token = state
        .store
        .registration_token_by_hash(&digest(&req.token))
        .await?
        .filter(|t| !t.revoked && t.expires_at > now && t.uses < t.max_uses)
        .ok_or_else(|| {
            ApiError::Unauthorized("invalid, revoked, expired or used-up registration token".into())
        })?;
    let n = &req.node;
    parse_node_id("node.id", &n.id)?;
    if token.node_id.as_deref().is_some_and(|bound| bound != n.id) {
        return Err(ApiError::Forbidden(format!(
            "this registration token is for node {}",
            token.node_id.as_deref().unwrap_or_default()
        )));
    }
    // Taking over an existing node (its credential, the tasks placed on it) needs an
    // administrator's token made for that node.
    let existing = state
        .store
        .list_nodes()
        .await?
        .into_iter()
        .find(|x| x.id == n.id);
    if existing.is_some() && token.node_id.is_none() {
        return Err(ApiError::Conflict(format!(
            "node {} is already registered; to register it again an administrator makes a registration token for this node (node_id) or removes the node",
            n.id
        )));
    }
    let host = host_fields(n.host.as_ref())?;
    if !n.cpu.is_finite() || n.cpu <= 0.0 || n.memory == 0 {
        return Err(ApiError::invalid("node", "cpu and memory must be positive"));
    }
    if n.gpus.len() > 64
        || n.gpus
            .iter()
            .any(|g| g.gpu_type.is_empty() || g.gpu_type.len() > 64 || g.memory == 0)
    {
        return Err(ApiError::invalid(
            "node.gpus",
            "at most 64 GPUs, each with a type and memory",
        ));
    }
    let indices: HashSet<u32> = n.gpus.iter().map(|g| g.index).collect();
    if indices.len() != n.gpus.len() {
        return Err(ApiError::invalid(
            "node.gpus",
            "GPU indices must be distinct",
        ));
    }
    // Counted only now that everything else is valid, in one statement with its checks.
    if !state
        .store
        .use_registration_token(&token.id, &n.id, now)
        .await?
    {
        return Err(ApiError::Unauthorized(
            "invalid, revoked, expired or used-up registration token".into(),
        ));
    }
    let gpus: Vec<Gpu> = n
        .gpus
        .iter()
        .map(|g| Gpu {
            index: g.index,
            gpu_type: g.gpu_type.clone(),
            mem_bytes: g.memory,
            util: 0.0,
        })
        .collect();
    let rec = NodeRecord {
        id: n.id.clone(),
        zone: n.zone.clone(),
        labels: crate::store::JsonText(n.labels.clone().into_iter().collect()),
        cpu_millis: (n.cpu * 1000.0).round() as i64,
        mem_bytes: n.memory as i64,
        gpus: crate::store::JsonText(gpus.clone()),
        schedulable: true,
        created_at: now,
        updated_at: now,
        credential_hash: None,
        last_seen: Some(now),
        status: NodeStatus::Ready,
        runtime: host.runtime,
        isolation: host.isolation,
        data_roots: host.data_roots,
        host_detail: host.detail,
        open_to_all: false,
    };
    state.store.upsert_node(&rec).await?;
    let credential = format!("{NODE_CREDENTIAL_PREFIX}{}", random_hex(24));
    state
        .store
        .set_node_credential(&rec.id, &digest(&credential))
        .await?;
    state.store.touch_node(&rec.id, now).await?;
    state.scheduler.invalidate_nodes();
    state.scheduler.wake();
    tracing::info!(node = %rec.id, gpus = gpus.len(), isolation = %rec.isolation, "agent registered");
    Ok(RegisterResponse {
        node_id: rec.id,
        credential,
    })
}

/// How a node runs tasks, as its agent reports it: runtime, isolation level, dataset roots and
/// how it limits and networks tasks (as the node row keeps them). An agent that says nothing
/// runs nothing untrusted.
pub(crate) fn host_fields(h: Option<&AgentHost>) -> Result<NodeHost, ApiError> {
    let Some(h) = h else {
        return Ok(NodeHost {
            runtime: String::new(),
            isolation: Isolation::None.as_str().into(),
            data_roots: "[]".into(),
            detail: "{}".into(),
        });
    };
    if !matches!(h.runtime.as_str(), "docker" | "process") {
        return Err(ApiError::invalid(
            "host.runtime",
            "runtime is docker or process",
        ));
    }
    let isolation = Isolation::parse(&h.isolation);
    if isolation == Isolation::Declared || isolation.as_str() != h.isolation {
        return Err(ApiError::invalid(
            "host.isolation",
            "isolation is container, sandbox, uid or none",
        ));
    }
    if h.data_roots.len() > 64
        || h.data_roots
            .iter()
            .any(|r| r == "/" || r.len() > 1024 || !access::is_clean_absolute(r))
    {
        return Err(ApiError::invalid(
            "host.data_roots",
            "at most 64 dataset roots, each a normalised absolute folder other than /",
        ));
    }
    if h.limits.len() > 1024 || h.network.len() > 1024 {
        return Err(ApiError::invalid(
            "host.limits",
            "limits and network are at most 1,024 characters each",
        ));
    }
    let address = match h.address.as_deref() {
        None => None,
        Some(a) => Some(
            a.parse::<std::net::IpAddr>()
                .map_err(|_| {
                    ApiError::invalid(
                        "host.address",
                        "the advertised address is an IPv4 or IPv6 address",
                    )
                })?
                .to_string(),
        ),
    };
    let detail = HostDetail {
        limits: h.limits.clone(),
        network: h.network.clone(),
        address,
    };
    Ok(NodeHost {
        runtime: h.runtime.clone(),
        isolation: isolation.as_str().into(),
        data_roots: serde_json::to_string(&h.data_roots).map_err(anyhow::Error::from)?,
        detail: serde_json::to_string(&detail).map_err(anyhow::Error::from)?,
    })
}
