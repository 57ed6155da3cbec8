//! `serve --demo`: two agents on simulated GPUs (4xA100-40G and 4xA40) run inside the server
//! process with the process runtime, so a newcomer can submit a task and watch it run with one
//! command and no GPU.

use std::path::Path;
use std::sync::Arc;

use autodl_agent::{Agent, AgentConfig, CancellationToken, ProcessRuntime, SimulatedBackend};

use crate::agents::REGISTRATION_TOKEN_PREFIX;
use crate::auth::secrets::{digest, new_id, random_hex};
use crate::state::{now_ms, AppState};
use crate::store::RegistrationTokenRecord;

pub const DEMO_NODES: [(&str, &str); 2] = [("demo-a100", "4xA100-40G"), ("demo-a40", "4xA40")];

/// Starts the demo agents; they stop (SIGTERM to their tasks, then SIGKILL) when `shutdown`
/// is cancelled.
pub async fn start_agents(
    state: &AppState,
    data_dir: &Path,
    shutdown: CancellationToken,
) -> anyhow::Result<Vec<Agent>> {
    // A short-lived registration token, made directly in the store: the demo has no
    // administrator yet to make one.
    let token = format!("{REGISTRATION_TOKEN_PREFIX}{}", random_hex(24));
    let now = now_ms();
    let owner = demo_owner(state).await?;
    state
        .store
        .create_registration_token(&RegistrationTokenRecord {
            id: new_id(),
            name: "demo agents".into(),
            token_hash: digest(&token),
            created_by: owner,
            created_at: now,
            expires_at: now + 3_600_000,
            revoked: false,
        })
        .await?;
    let mut agents = Vec::new();
    for (i, (node, gpus)) in DEMO_NODES.iter().enumerate() {
        let config = AgentConfig::new(state.settings.public_url())
            .node_id(*node)
            .zone("demo")
            .registration_token(token.clone())
            .state_dir(data_dir.join(node))
            .cpu(32)
            .memory(256 << 30);
        let backend = Arc::new(SimulatedBackend::from_spec(gpus, i as u64 + 1)?);
        let agent = Agent::new(config, backend, Arc::new(ProcessRuntime::new()))?;
        let (a, t) = (agent.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(e) = a.run(t).await {
                tracing::error!(node = a.node_id(), error = %e, "demo agent stopped");
            }
        });
        agents.push(agent);
    }
    tracing::info!(
        "demo agents started: {}",
        DEMO_NODES.map(|(n, g)| format!("{n} ({g})")).join(", ")
    );
    Ok(agents)
}

/// Registration tokens name their creator; the demo's is a service account of its own.
async fn demo_owner(state: &AppState) -> anyhow::Result<String> {
    use crate::store::{TenantRecord, UserRecord};
    const EMAIL: &str = "demo-agents@autodl.local";
    if let Some(u) = state.store.user_by_email(EMAIL).await? {
        return Ok(u.id);
    }
    let now = now_ms();
    let tenant = TenantRecord {
        id: new_id(),
        name: "autodl demo agents".into(),
        created_at: now,
    };
    let user = UserRecord {
        id: new_id(),
        email: EMAIL.into(),
        // Not a hash of anything: nobody can sign in as this account.
        password_hash: "!".into(),
        tenant_id: tenant.id.clone(),
        role: "owner".into(),
        platform_admin: false,
        disabled: true,
        created_at: now,
    };
    state.store.create_tenant_with_owner(&tenant, &user).await?;
    Ok(user.id)
}
