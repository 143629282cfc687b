-- The replica that relays a remote session (docs/agent.md, Several
-- replicas): a leg that lands on another replica is proxied to it, one hop.
ALTER TABLE remote_sessions ADD COLUMN relay_url TEXT NOT NULL DEFAULT '';
