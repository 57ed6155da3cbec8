-- Sign-ups waiting for their email address to be confirmed (when the server sends email): the
-- account is made when the link sent there is followed.
CREATE TABLE signup_requests (
    token_hash    TEXT PRIMARY KEY,
    email         TEXT NOT NULL,
    password_hash TEXT NOT NULL,
    tenant_name   TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL
);
CREATE INDEX signup_requests_email_idx ON signup_requests (email);
