-- The replicas that relay remote sessions, each with its last heartbeat
-- (docs/agent.md, Several replicas): an open session whose replica has
-- not been heard from for --remote-replica-timeout is ended by another,
-- and counts under no cap meanwhile. Times are the database's clock, so
-- that the replicas' own clocks need not agree.
CREATE TABLE remote_relays (
    relay_url TEXT PRIMARY KEY,
    seen_at   BIGINT NOT NULL
);
CREATE INDEX remote_sessions_open_by_relay ON remote_sessions (relay_url) WHERE ended_at IS NULL;
