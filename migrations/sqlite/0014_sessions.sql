-- What a task is for ('batch' or 'session'), so a member's open sessions are one count.
ALTER TABLE tasks ADD COLUMN kind TEXT NOT NULL DEFAULT 'batch';
CREATE INDEX tasks_sessions_idx ON tasks (user_id, state) WHERE kind = 'session';
-- An organization's rules for sessions and idle GPUs (JSON of SessionPolicy; NULL: defaults).
ALTER TABLE tenants ADD COLUMN session_policy TEXT;
