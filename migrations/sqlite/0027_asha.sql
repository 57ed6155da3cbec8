-- What a sweep optimises (JSON of `tasks::asha::Objective`: metric, mode, and for ASHA its
-- rungs' settings); NULL when it names no metric.
ALTER TABLE sweeps ADD COLUMN objective TEXT;
-- The value each ASHA trial reported when it first reached each rung (by index), and when:
-- a trial is judged against those that reached its rung before it.
CREATE TABLE sweep_rungs (
    sweep_id TEXT NOT NULL,
    task_id  TEXT NOT NULL REFERENCES tasks (id),
    rung     BIGINT NOT NULL,
    value    DOUBLE PRECISION NOT NULL,
    at       BIGINT NOT NULL,
    PRIMARY KEY (task_id, rung)
);
CREATE INDEX sweep_rungs_rung_idx ON sweep_rungs (sweep_id, rung, at);
-- Trials ASHA stopped early, and why.
CREATE TABLE sweep_stops (
    task_id  TEXT PRIMARY KEY REFERENCES tasks (id),
    sweep_id TEXT NOT NULL,
    message  TEXT NOT NULL,
    at       BIGINT NOT NULL
);
CREATE INDEX sweep_stops_sweep_idx ON sweep_stops (sweep_id);
