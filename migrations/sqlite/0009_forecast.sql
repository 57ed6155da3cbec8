-- The start-time forecast reads the run times of the latest completed tasks.
CREATE INDEX tasks_state_finished_idx ON tasks (state, finished_at);
