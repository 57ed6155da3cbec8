-- Several servers on one database. The leader's term: bumped by every server that becomes the
-- leader, and checked by each of its scheduling writes, so a deposed leader's writes are refused.
CREATE TABLE scheduler_leader (
    id INTEGER PRIMARY KEY,
    term BIGINT NOT NULL,
    holder TEXT NOT NULL,
    since BIGINT NOT NULL
);
INSERT INTO scheduler_leader (id, term, holder, since) VALUES (1, 0, '', 0);

-- Why a pending task waits (JSON), written by the leader, so that every server can answer.
ALTER TABLE tasks ADD COLUMN waiting TEXT;
