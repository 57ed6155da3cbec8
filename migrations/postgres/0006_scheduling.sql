-- What each run has been charged for, so usage is charged once, from the run's own start,
-- by whichever server schedules, and a run that ended between two cycles still pays its tail.
-- `tasks.attained_gpu_seconds` is from now on the service of ended runs only.
ALTER TABLE attempts ADD COLUMN gpu_seconds DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN charged_until BIGINT;
-- Charged to its end: the scheduler looks only at runs that are not.
ALTER TABLE attempts ADD COLUMN settled BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE attempts SET charged_until = ended_at, settled = TRUE WHERE ended_at IS NOT NULL;
CREATE INDEX attempts_unsettled_idx ON attempts (task_id) WHERE settled = FALSE;
-- Open runs were charged cycle by cycle into their task's total until now: count that as
-- theirs and charge them from here on.
UPDATE attempts SET
    gpu_seconds = (SELECT t.attained_gpu_seconds FROM tasks t WHERE t.id = attempts.task_id),
    charged_until = (SELECT t.updated_at FROM tasks t WHERE t.id = attempts.task_id)
WHERE ended_at IS NULL;
UPDATE tasks SET attained_gpu_seconds = 0
WHERE id IN (SELECT task_id FROM attempts WHERE ended_at IS NULL);

-- A tenant's (or user's) relative share in fair-share; 1 when unset.
ALTER TABLE quotas ADD COLUMN share DOUBLE PRECISION;
