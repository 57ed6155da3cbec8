-- Which nodes each placed task occupies, so an agent's poll reads its own node's work by an
-- index instead of every active task. Rows exist exactly while a task has a placement.
CREATE TABLE task_nodes (
    node_id  TEXT NOT NULL,
    task_id  TEXT NOT NULL REFERENCES tasks (id),
    PRIMARY KEY (node_id, task_id)
);
CREATE INDEX task_nodes_task_idx ON task_nodes (task_id);
INSERT INTO task_nodes (node_id, task_id)
SELECT DISTINCT json_extract(p.value, '$.node'), t.id
FROM tasks t, json_each(t.placement) p
WHERE t.placement IS NOT NULL AND json_extract(p.value, '$.node') IS NOT NULL;
