-- How each node runs tasks, as its agent reports it. A node that cannot isolate tasks
-- ("none") takes only tasks of organizations an administrator trusts, unless an
-- administrator opened it to all. Nodes registered by hand (no agent) are "declared".
ALTER TABLE nodes ADD COLUMN runtime TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN isolation TEXT NOT NULL DEFAULT 'none';
ALTER TABLE nodes ADD COLUMN data_roots TEXT NOT NULL DEFAULT '[]';
ALTER TABLE nodes ADD COLUMN open_to_all BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE nodes SET isolation = 'declared' WHERE credential_hash IS NULL;

-- Organizations whose tasks may run on trusted-only nodes.
ALTER TABLE tenants ADD COLUMN trusted BOOLEAN NOT NULL DEFAULT FALSE;

-- Registration tokens are single use unless an administrator says how many nodes may join
-- with one; a token naming a node may replace that existing node's credential.
ALTER TABLE registration_tokens ADD COLUMN max_uses BIGINT NOT NULL DEFAULT 1;
ALTER TABLE registration_tokens ADD COLUMN uses BIGINT NOT NULL DEFAULT 0;
ALTER TABLE registration_tokens ADD COLUMN node_id TEXT;

-- Bytes of object storage per organization (uploads, checkpoints, results) and its cap.
ALTER TABLE quotas ADD COLUMN max_storage_bytes BIGINT;
CREATE TABLE tenant_storage (
    tenant_id  TEXT PRIMARY KEY REFERENCES tenants (id),
    bytes      BIGINT NOT NULL DEFAULT 0
);
