-- The leader's lease and heartbeat, in a row of their own: the leader's fenced writes lock
-- `scheduler_leader`'s row for their whole transaction, and a renewal must never wait on them.
-- `term` and `session` (the leader's PostgreSQL application_name) say whose lease it is:
-- a follower ends only those sessions, and only while that term still leads. `renewed_at`:
-- when the lease was last renewed; `last_cycle_at`: when the leader's last scheduling cycle
-- ended (every server's /healthz says when the scheduler has stalled). Milliseconds since the
-- epoch, by the database's clock on PostgreSQL.
CREATE TABLE scheduler_lease (
    id INTEGER PRIMARY KEY,
    term BIGINT NOT NULL,
    session TEXT NOT NULL,
    renewed_at BIGINT NOT NULL,
    last_cycle_at BIGINT NOT NULL
);
INSERT INTO scheduler_lease (id, term, session, renewed_at, last_cycle_at) VALUES (1, 0, '', 0, 0);
