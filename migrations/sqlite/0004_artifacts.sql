-- Checkpoints and results kept in object storage. A row is "uploading" while its files go up
-- and "complete" once all of them are stored and the manifest is written: only complete
-- checkpoints are restored from or listed, so a half-uploaded one is never seen.
CREATE TABLE artifacts (
    id            TEXT PRIMARY KEY,
    task_id       TEXT NOT NULL REFERENCES tasks (id),
    tenant_id     TEXT NOT NULL REFERENCES tenants (id),
    attempt       BIGINT NOT NULL,
    -- checkpoint or results
    kind          TEXT NOT NULL,
    -- uploading, complete or deleted
    state         TEXT NOT NULL,
    bucket        TEXT NOT NULL,
    prefix        TEXT NOT NULL,
    -- JSON array of {"path", "size"} once complete
    manifest      TEXT,
    files         BIGINT NOT NULL DEFAULT 0,
    size_bytes    BIGINT NOT NULL DEFAULT 0,
    step          BIGINT,
    epoch         DOUBLE PRECISION,
    created_at    BIGINT NOT NULL,
    completed_at  BIGINT
);
CREATE INDEX artifacts_task_idx ON artifacts (task_id, kind, state, created_at);

-- The task list's common filters (state, the caller's own tasks) without walking the tenant.
CREATE INDEX tasks_tenant_state_created_idx ON tasks (tenant_id, state, created_at DESC, id DESC);
CREATE INDEX tasks_user_created_idx ON tasks (user_id, created_at DESC, id DESC);

-- Hourly utilization per task, folded from raw samples before they are deleted, so usage
-- reports of past months still know each user's average utilization.
CREATE TABLE task_util_rollups (
    task_id   TEXT NOT NULL,
    hour      BIGINT NOT NULL,
    samples   BIGINT NOT NULL,
    avg_util  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (task_id, hour)
);
