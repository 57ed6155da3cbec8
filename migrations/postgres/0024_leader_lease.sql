-- The leader's lease and heartbeat: when it last renewed its lease (a follower takes over a
-- leader silent past the lease, even one whose lock connection PostgreSQL still sees: a frozen
-- process) and when its last scheduling cycle ended (every server's /healthz says when the
-- scheduler has stalled). Milliseconds since the epoch, by the database's clock on PostgreSQL.
ALTER TABLE scheduler_leader ADD COLUMN renewed_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE scheduler_leader ADD COLUMN last_cycle_at BIGINT NOT NULL DEFAULT 0;
