-- A task's number in its organization (#1, #2, ...): what people say and type, where an id
-- is 36 characters. Numbers come from `task_numbers`, one row per organization, whose row
-- lock orders concurrent submissions; the tasks already stored are numbered by submission.
ALTER TABLE tasks ADD COLUMN number BIGINT NOT NULL DEFAULT 0;
UPDATE tasks SET number = r.n
FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY tenant_id ORDER BY created_at, id) AS n FROM tasks) r
WHERE r.id = tasks.id;
-- Partial: a server of the previous release, during a rolling upgrade, stores 0.
CREATE UNIQUE INDEX tasks_tenant_number ON tasks (tenant_id, number) WHERE number > 0;
CREATE INDEX tasks_tenant_name ON tasks (tenant_id, name);
CREATE TABLE task_numbers (
    tenant_id TEXT PRIMARY KEY,
    last      BIGINT NOT NULL
);
INSERT INTO task_numbers (tenant_id, last) SELECT tenant_id, MAX(number) FROM tasks GROUP BY tenant_id;
