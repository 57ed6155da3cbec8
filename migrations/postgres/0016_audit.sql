-- The audit trail: security- and money-relevant actions, append-only. Each record carries the
-- hash of the one before it (a hash chain), so an edited, removed or reordered record is found
-- by `autodl-server audit verify`.
CREATE TABLE audit_log (
    seq BIGINT PRIMARY KEY,
    at BIGINT NOT NULL,
    -- The organization the action concerns; NULL for platform-wide ones (nodes).
    tenant_id TEXT,
    actor_id TEXT,
    actor_email TEXT,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    -- JSON object.
    detail TEXT NOT NULL,
    ip TEXT,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX audit_log_tenant_idx ON audit_log (tenant_id, seq);
CREATE INDEX audit_log_action_idx ON audit_log (action, seq);
-- The chain's head: appends take its row lock (one writer at a time on every backend and every
-- replica), and it remembers the last hash, so cutting records off the end is found too.
CREATE TABLE audit_head (
    id INTEGER PRIMARY KEY,
    seq BIGINT NOT NULL,
    hash TEXT NOT NULL
);
INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '');
