-- What a node's agent says of how it confines tasks beyond its isolation level (its limits
-- and its task networks), as JSON.
ALTER TABLE nodes ADD COLUMN host_detail TEXT NOT NULL DEFAULT '{}';
