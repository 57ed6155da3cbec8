-- Each competing person's fair-share and utilization factors as the scheduler ranked them,
-- sampled every few minutes: their standing over time (why a priority is what it is).
CREATE TABLE standings (
    user_id TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    at BIGINT NOT NULL,
    fair_share REAL NOT NULL,
    utilization REAL NOT NULL,
    PRIMARY KEY (user_id, at)
);
CREATE INDEX standings_at_idx ON standings (at);
