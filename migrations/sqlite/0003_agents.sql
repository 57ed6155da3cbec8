-- Agents: registration tokens, node credentials and liveness, dispatch state, GPU samples.
CREATE TABLE registration_tokens (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    token_hash  TEXT NOT NULL UNIQUE,
    created_by  TEXT NOT NULL REFERENCES users (id),
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    revoked     BOOLEAN NOT NULL DEFAULT FALSE
);

ALTER TABLE nodes ADD COLUMN credential_hash TEXT;
ALTER TABLE nodes ADD COLUMN last_seen BIGINT;
-- ready, cordoned (no new tasks), draining (no new tasks, its tasks are moved), lost (no heartbeat).
ALTER TABLE nodes ADD COLUMN status TEXT NOT NULL DEFAULT 'ready';
CREATE UNIQUE INDEX nodes_credential_idx ON nodes (credential_hash);

-- Set when the scheduler wants a running task stopped (preempted, migrated, drained): the
-- agent is told to stop it, and its report of the stop requeues it.
ALTER TABLE tasks ADD COLUMN stop_reason TEXT;

CREATE TABLE gpu_samples (
    id           INTEGER PRIMARY KEY,
    node_id      TEXT NOT NULL,
    gpu_index    BIGINT NOT NULL,
    at           BIGINT NOT NULL,
    util         DOUBLE PRECISION NOT NULL,
    mem_used     BIGINT NOT NULL,
    mem_total    BIGINT NOT NULL,
    temperature  DOUBLE PRECISION,
    power_w      DOUBLE PRECISION,
    task_id      TEXT
);
CREATE INDEX gpu_samples_node_idx ON gpu_samples (node_id, gpu_index, at);
CREATE INDEX gpu_samples_task_idx ON gpu_samples (task_id, at);
CREATE INDEX gpu_samples_at_idx ON gpu_samples (at);

-- Hourly rollups kept for months after raw samples are gone.
CREATE TABLE gpu_rollups (
    node_id     TEXT NOT NULL,
    gpu_index   BIGINT NOT NULL,
    hour        BIGINT NOT NULL,
    samples     BIGINT NOT NULL,
    avg_util    DOUBLE PRECISION NOT NULL,
    max_mem     BIGINT NOT NULL,
    PRIMARY KEY (node_id, gpu_index, hour)
);
