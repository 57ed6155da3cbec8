-- Accounts and tenancy. Times are Unix milliseconds (UTC) in both backends.
CREATE TABLE tenants (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE UNIQUE INDEX tenants_name_key ON tenants (lower(name));

CREATE TABLE users (
    id              TEXT PRIMARY KEY,
    email           TEXT NOT NULL UNIQUE,
    password_hash   TEXT NOT NULL,
    tenant_id       TEXT NOT NULL REFERENCES tenants (id),
    role            TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'member')),
    platform_admin  BOOLEAN NOT NULL DEFAULT FALSE,
    disabled        BOOLEAN NOT NULL DEFAULT FALSE,
    created_at      BIGINT NOT NULL
);
CREATE INDEX users_tenant_idx ON users (tenant_id);

CREATE TABLE sessions (
    id          TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL REFERENCES users (id),
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    revoked     BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX sessions_user_idx ON sessions (user_id);

CREATE TABLE api_keys (
    id            TEXT PRIMARY KEY,
    user_id       TEXT NOT NULL REFERENCES users (id),
    name          TEXT NOT NULL,
    prefix        TEXT NOT NULL,
    key_hash      TEXT NOT NULL UNIQUE,
    created_at    BIGINT NOT NULL,
    last_used_at  BIGINT,
    expires_at    BIGINT,
    revoked       BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX api_keys_user_idx ON api_keys (user_id);

CREATE TABLE invitations (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants (id),
    email       TEXT NOT NULL,
    role        TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'member')),
    token_hash  TEXT NOT NULL UNIQUE,
    created_by  TEXT NOT NULL REFERENCES users (id),
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    accepted_at BIGINT,
    revoked     BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX invitations_tenant_idx ON invitations (tenant_id);

-- One row per capped subject; NULL columns mean "no cap of its own".
CREATE TABLE quotas (
    scope                TEXT NOT NULL CHECK (scope IN ('tenant', 'user')),
    subject_id           TEXT NOT NULL,
    max_gpus             BIGINT,
    gpu_hours_per_month  DOUBLE PRECISION,
    max_queued_tasks     BIGINT,
    allowed_gpu_types    TEXT,
    updated_at           BIGINT NOT NULL,
    PRIMARY KEY (scope, subject_id)
);
