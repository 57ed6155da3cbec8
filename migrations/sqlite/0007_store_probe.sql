-- One row the health check rewrites: a database that cannot write (full or read-only disk)
-- is reported as such instead of "ok".
CREATE TABLE store_probe (
    id INTEGER PRIMARY KEY,
    at BIGINT NOT NULL
);
