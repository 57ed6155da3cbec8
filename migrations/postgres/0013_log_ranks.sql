-- Which worker of a multi-worker task printed a line (its index in the placement); NULL for
-- tasks of one worker.
ALTER TABLE task_logs ADD COLUMN rank BIGINT;
