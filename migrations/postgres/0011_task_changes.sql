-- A change feed of what the scheduler reads of each task, so the leader applies only what
-- changed since its last cycle instead of reading every active task. `rev` is the id of the
-- transaction that last changed a column the scheduler reads (writes of `waiting`, the
-- scheduler's own explanations, of `updated_at` alone or of the name do not count). Concurrent
-- transactions commit out of id order, so a reader asks again from the oldest transaction
-- still running when it last read (`pg_snapshot_xmin`): nothing committed later is missed.
ALTER TABLE tasks ADD COLUMN rev BIGINT NOT NULL DEFAULT 0;
CREATE INDEX tasks_rev_idx ON tasks (rev);

CREATE FUNCTION tasks_rev() RETURNS trigger AS $$
BEGIN
    IF (   NEW.state IS DISTINCT FROM OLD.state OR NEW.spec IS DISTINCT FROM OLD.spec
        OR NEW.attempts IS DISTINCT FROM OLD.attempts OR NEW.batch_size IS DISTINCT FROM OLD.batch_size
        OR NEW.placement IS DISTINCT FROM OLD.placement
        OR NEW.attained_gpu_seconds IS DISTINCT FROM OLD.attained_gpu_seconds
        OR NEW.last_checkpoint_at IS DISTINCT FROM OLD.last_checkpoint_at
        OR NEW.stop_reason IS DISTINCT FROM OLD.stop_reason
        OR NEW.tenant_id IS DISTINCT FROM OLD.tenant_id OR NEW.user_id IS DISTINCT FROM OLD.user_id
        OR NEW.created_at IS DISTINCT FROM OLD.created_at) THEN
        NEW.rev := pg_current_xact_id()::text::bigint;
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

-- New rows are given theirs by the INSERT itself.
CREATE TRIGGER tasks_rev BEFORE UPDATE ON tasks
    FOR EACH ROW EXECUTE FUNCTION tasks_rev();
