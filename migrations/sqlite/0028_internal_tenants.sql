-- An organization the platform keeps for itself (the demo agents' service account): not
-- listed to administrators among the people's organizations and users.
ALTER TABLE tenants ADD COLUMN internal BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE tenants SET internal = TRUE
WHERE id IN (SELECT tenant_id FROM users WHERE email = 'demo-agents@autodl.local');
