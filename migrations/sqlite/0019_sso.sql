-- Single sign-on: an OpenID provider for one organization (`scope` is its id) or for the whole
-- platform (`scope` = 'platform'); one each.
CREATE TABLE sso_providers (
    id TEXT PRIMARY KEY,
    scope TEXT NOT NULL UNIQUE,
    label TEXT NOT NULL,
    issuer TEXT NOT NULL,
    client_id TEXT NOT NULL,
    client_secret TEXT NOT NULL,
    -- JSON list of email domains whose people may sign in (empty: any).
    allowed_domains TEXT NOT NULL,
    -- JSON list of scopes asked for besides openid, email and profile.
    scopes TEXT NOT NULL,
    -- The claim whose values pick a role, and the JSON map from value to role.
    role_claim TEXT,
    role_map TEXT NOT NULL,
    -- The role when no value maps; NULL refuses such people.
    default_role TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
-- Which account a provider's subject signs in to (made on first sign-in, or linked by email).
CREATE TABLE sso_identities (
    provider_id TEXT NOT NULL REFERENCES sso_providers(id) ON DELETE CASCADE,
    subject TEXT NOT NULL,
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (provider_id, subject)
);
-- Sign-ins under way, by the hash of their `state`; each is taken once.
CREATE TABLE sso_logins (
    state_hash TEXT PRIMARY KEY,
    provider_id TEXT NOT NULL,
    nonce TEXT NOT NULL,
    pkce_verifier TEXT NOT NULL,
    -- Hash of the secret in the browser's cookie: the sign-in finishes only in that browser.
    browser_hash TEXT NOT NULL,
    return_to TEXT NOT NULL,
    -- Set when a signed-in person links their account to the provider.
    link_user TEXT,
    expires_at BIGINT NOT NULL
);
-- An organization may sign its people in through its provider only.
ALTER TABLE tenants ADD COLUMN password_login BOOLEAN NOT NULL DEFAULT TRUE;
