-- An organization's webhooks: where events of its tasks are sent, signed with `secret`.
CREATE TABLE webhooks (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    url TEXT NOT NULL,
    secret TEXT NOT NULL,
    -- JSON list of event names it wants.
    events TEXT NOT NULL,
    created_by TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX webhooks_tenant_idx ON webhooks (tenant_id);
-- Each event for each webhook, kept until delivered or given up (an outbox: a restart loses none).
CREATE TABLE webhook_deliveries (
    id TEXT PRIMARY KEY,
    webhook_id TEXT NOT NULL REFERENCES webhooks(id) ON DELETE CASCADE,
    event TEXT NOT NULL,
    body TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    -- When to try next (clock ms); NULL once delivered or given up.
    next_at BIGINT,
    delivered_at BIGINT,
    last_error TEXT,
    created_at BIGINT NOT NULL
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_at) WHERE next_at IS NOT NULL;
CREATE INDEX webhook_deliveries_hook_idx ON webhook_deliveries (webhook_id, created_at);
