-- Which events each person wants by email (a JSON list of event names); no row: none.
CREATE TABLE notification_settings (
    user_id TEXT PRIMARY KEY REFERENCES users(id) ON DELETE CASCADE,
    email_events TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);
-- Email waiting to go out, kept until sent or given up (an outbox: a restart loses none).
CREATE TABLE email_outbox (
    id TEXT PRIMARY KEY,
    to_addr TEXT NOT NULL,
    event TEXT NOT NULL,
    subject TEXT NOT NULL,
    body TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    -- When to try next (clock ms); NULL once sent or given up.
    next_at BIGINT,
    sent_at BIGINT,
    last_error TEXT,
    created_at BIGINT NOT NULL
);
CREATE INDEX email_outbox_due_idx ON email_outbox (next_at) WHERE next_at IS NOT NULL;
-- "Quota nearly used" told once per subject, month and level, whichever server notices first.
CREATE TABLE quota_alerts (
    scope TEXT NOT NULL,
    subject_id TEXT NOT NULL,
    month TEXT NOT NULL,
    level BIGINT NOT NULL,
    at BIGINT NOT NULL,
    PRIMARY KEY (scope, subject_id, month, level)
);
