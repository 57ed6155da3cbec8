-- Sweeps: one submission that made a task per trial. The trials are ordinary tasks labelled
-- `sweep=<id>`, each carrying its trial and parameters in its spec; the row keeps what the
-- sweep was asked for, for listing.
CREATE TABLE sweeps (
    id               TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL REFERENCES tenants (id),
    user_id          TEXT NOT NULL REFERENCES users (id),
    name             TEXT NOT NULL,
    method           TEXT NOT NULL,
    parameters       TEXT NOT NULL,
    max_concurrency  BIGINT NOT NULL,
    trials           BIGINT NOT NULL,
    created_at       BIGINT NOT NULL
);
CREATE INDEX sweeps_tenant_idx ON sweeps (tenant_id, created_at);
