-- A gang spanning nodes ends when every node's workers have ended: a node whose workers all
-- succeeded records its part here and waits for the others (its results stay kept). One row
-- per node and attempt; `results_uploading`: the node still keeps its results for the server.
CREATE TABLE attempt_parts (
    task_id           TEXT NOT NULL REFERENCES tasks (id),
    attempt           BIGINT NOT NULL,
    node              TEXT NOT NULL,
    results_uploading BOOLEAN NOT NULL DEFAULT FALSE,
    ended_at          BIGINT NOT NULL,
    PRIMARY KEY (task_id, attempt, node)
);
-- The node an upload comes from: every node of a gang uploads the results of its own
-- workers, and one node's upload never replaces another's.
ALTER TABLE artifacts ADD COLUMN node TEXT;
