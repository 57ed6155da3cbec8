-- Which nodes each placed task occupies, so an agent's poll reads its own node's work by an
-- index instead of every active task. Rows exist exactly while a task has a placement.
CREATE TABLE task_nodes (
    node_id  TEXT NOT NULL,
    task_id  TEXT NOT NULL REFERENCES tasks (id),
    PRIMARY KEY (node_id, task_id)
);
CREATE INDEX task_nodes_task_idx ON task_nodes (task_id);
INSERT INTO task_nodes (node_id, task_id)
SELECT DISTINCT p->>'node', t.id
FROM tasks t, json_array_elements(t.placement::json) p
WHERE t.placement IS NOT NULL AND p->>'node' IS NOT NULL;
