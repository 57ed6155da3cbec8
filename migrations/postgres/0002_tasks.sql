-- Nodes, tasks and everything recorded about them. JSON documents are TEXT in both backends.
CREATE TABLE nodes (
    id           TEXT PRIMARY KEY,
    zone         TEXT NOT NULL DEFAULT '',
    labels       TEXT NOT NULL DEFAULT '{}',
    cpu_millis   BIGINT NOT NULL,
    mem_bytes    BIGINT NOT NULL,
    gpus         TEXT NOT NULL,
    schedulable  BOOLEAN NOT NULL DEFAULT TRUE,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL
);

CREATE TABLE tasks (
    id                    TEXT PRIMARY KEY,
    tenant_id             TEXT NOT NULL REFERENCES tenants (id),
    user_id               TEXT NOT NULL REFERENCES users (id),
    name                  TEXT NOT NULL,
    state                 TEXT NOT NULL,
    spec                  TEXT NOT NULL,
    gpus_total            BIGINT NOT NULL,
    idempotency_key       TEXT,
    attempts              BIGINT NOT NULL DEFAULT 0,
    batch_size            BIGINT,
    placement             TEXT,
    attained_gpu_seconds  DOUBLE PRECISION NOT NULL DEFAULT 0,
    last_checkpoint_at    BIGINT,
    created_at            BIGINT NOT NULL,
    updated_at            BIGINT NOT NULL,
    started_at            BIGINT,
    finished_at           BIGINT
);
CREATE INDEX tasks_tenant_created_idx ON tasks (tenant_id, created_at DESC, id DESC);
CREATE INDEX tasks_state_idx ON tasks (state);
CREATE UNIQUE INDEX tasks_idempotency_key ON tasks (user_id, idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE TABLE task_labels (
    task_id  TEXT NOT NULL REFERENCES tasks (id),
    key      TEXT NOT NULL,
    value    TEXT NOT NULL,
    PRIMARY KEY (task_id, key)
);
CREATE INDEX task_labels_kv_idx ON task_labels (key, value);

CREATE TABLE task_events (
    id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id  TEXT NOT NULL REFERENCES tasks (id),
    at       BIGINT NOT NULL,
    kind     TEXT NOT NULL,
    message  TEXT NOT NULL
);
CREATE INDEX task_events_task_idx ON task_events (task_id, id);

CREATE TABLE attempts (
    task_id     TEXT NOT NULL REFERENCES tasks (id),
    number      BIGINT NOT NULL,
    node        TEXT,
    placement   TEXT NOT NULL,
    gpus        BIGINT NOT NULL,
    started_at  BIGINT NOT NULL,
    ended_at    BIGINT,
    exit_code   BIGINT,
    reason      TEXT,
    batch_size  BIGINT,
    PRIMARY KEY (task_id, number)
);
CREATE INDEX attempts_started_idx ON attempts (started_at);

CREATE TABLE task_logs (
    id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id  TEXT NOT NULL REFERENCES tasks (id),
    attempt  BIGINT NOT NULL,
    at       BIGINT NOT NULL,
    stream   TEXT NOT NULL,
    line     TEXT NOT NULL
);
CREATE INDEX task_logs_task_idx ON task_logs (task_id, id);

CREATE TABLE task_metrics (
    id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id  TEXT NOT NULL REFERENCES tasks (id),
    at       BIGINT NOT NULL,
    sample   TEXT NOT NULL
);
CREATE INDEX task_metrics_task_idx ON task_metrics (task_id, at);

-- Decayed GPU usage per user and tenant, for fair-share and monthly quotas.
CREATE TABLE usage (
    scope                 TEXT NOT NULL,
    subject_id            TEXT NOT NULL,
    decayed_gpu_seconds   DOUBLE PRECISION NOT NULL,
    updated_at            BIGINT NOT NULL,
    window_alloc_gpu_seconds DOUBLE PRECISION NOT NULL,
    window_busy_gpu_seconds  DOUBLE PRECISION NOT NULL,
    month                 TEXT NOT NULL,
    month_gpu_seconds     DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (scope, subject_id)
);
