-- A change feed of what the scheduler reads of each task, so the leader applies only what
-- changed since its last cycle instead of reading every active task. `rev` grows with every
-- change to a column the scheduler reads; writes of `waiting` (the scheduler's own
-- explanations), `updated_at` alone or the task's name do not count. SQLite serializes
-- writers, so revisions grow in commit order: a reader that saw revision r has seen every
-- change up to r.
ALTER TABLE tasks ADD COLUMN rev INTEGER NOT NULL DEFAULT 0;
UPDATE tasks SET rev = rowid;
CREATE INDEX tasks_rev_idx ON tasks (rev);

-- New rows are given theirs by the INSERT itself (a trigger would rewrite every new row).
CREATE TRIGGER tasks_rev_on_update AFTER UPDATE ON tasks
WHEN NEW.rev = OLD.rev AND (
       NEW.state IS NOT OLD.state OR NEW.spec IS NOT OLD.spec OR NEW.attempts IS NOT OLD.attempts
    OR NEW.batch_size IS NOT OLD.batch_size OR NEW.placement IS NOT OLD.placement
    OR NEW.attained_gpu_seconds IS NOT OLD.attained_gpu_seconds
    OR NEW.last_checkpoint_at IS NOT OLD.last_checkpoint_at OR NEW.stop_reason IS NOT OLD.stop_reason
    OR NEW.tenant_id IS NOT OLD.tenant_id OR NEW.user_id IS NOT OLD.user_id
    OR NEW.created_at IS NOT OLD.created_at)
BEGIN
    UPDATE tasks SET rev = (SELECT COALESCE(MAX(rev), 0) + 1 FROM tasks) WHERE id = NEW.id;
END;
