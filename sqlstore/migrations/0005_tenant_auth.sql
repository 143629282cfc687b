-- How each tenant's end users authenticate (S9): one row per tenant that has
-- configured it.
CREATE TABLE tenant_auth (
    tenant       TEXT PRIMARY KEY REFERENCES tenants (name) ON DELETE CASCADE,
    method       TEXT NOT NULL,
    jwks_url     TEXT NOT NULL,
    issuer       TEXT NOT NULL,
    audience     TEXT NOT NULL,
    webhook_url  TEXT NOT NULL,
    default_role TEXT NOT NULL,
    updated_at   BIGINT NOT NULL
);
