-- The leader rewrites waiting tasks' explanations (`waiting`) as the queue moves: room left
-- on each page lets PostgreSQL update such a row in place (a heap-only update) instead of
-- adding an entry to every index of `tasks` for each rewrite. Pages written from now on keep
-- the room; older ones get it as they are rewritten.
ALTER TABLE tasks SET (fillfactor = 70);
