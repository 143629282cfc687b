-- OIDC sign-in to the console (docs/console.md): a jwks tenant's client at
-- its identity provider. The client secret is kept as given (fleetd must
-- present it to the token endpoint) and is never shown by the API.
ALTER TABLE tenant_auth ADD COLUMN oidc_client_id TEXT NOT NULL DEFAULT '';
ALTER TABLE tenant_auth ADD COLUMN oidc_client_secret TEXT NOT NULL DEFAULT '';
