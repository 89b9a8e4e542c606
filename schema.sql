-- gitplane state schema. A public interface: reports and people query it with sqlite3.
--
-- Applied by gitplane-state's migrations: each `-- migration N` block below runs once, in a
-- transaction that ends with `PRAGMA user_version = N`. Never edit a block that has shipped:
-- append a new one.
--
-- Times are UTC, ISO 8601 text (`2026-11-21T23:20:50.123Z`).
-- Secret values live only in `resource_secret`, which no view reads.

-- migration 1

-- One row per environment and apply: what commit, how it ended, and what it changed.
CREATE TABLE deployment (
    id          INTEGER PRIMARY KEY,
    env         TEXT NOT NULL,
    commit_id   TEXT,                      -- NULL when the revision itself could not be read
    kind        TEXT NOT NULL DEFAULT 'commit' CHECK (kind IN ('commit', 'drift')),
                                           -- 'drift': a scheduled re-apply of the last good commit
    status      TEXT NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'held')),
    started_at  TEXT NOT NULL,
    finished_at TEXT,                      -- NULL while running
    created     INTEGER NOT NULL DEFAULT 0,
    updated     INTEGER NOT NULL DEFAULT 0,
    deleted     INTEGER NOT NULL DEFAULT 0,
    unchanged   INTEGER NOT NULL DEFAULT 0,
    failed      INTEGER NOT NULL DEFAULT 0,
    error       TEXT,                      -- why a failed deployment failed (load, build, drivers)
    held        TEXT                       -- while held by the deletion guard: JSON array of the
                                           -- resources it would delete
);
CREATE INDEX deployment_env ON deployment (env, id);

-- The resources gitplane has provisioned, one row per GUResID.
CREATE TABLE resource (
    guresid       TEXT PRIMARY KEY,
    env           TEXT NOT NULL,
    app           TEXT,                    -- NULL for resources shared by every app
    type          TEXT NOT NULL,
    class         TEXT NOT NULL,
    res_id        TEXT NOT NULL,
    definition    TEXT NOT NULL,
    driver        TEXT NOT NULL,
    account       TEXT,                    -- the resource account's name (driver_account), if any
    deletion_policy TEXT NOT NULL DEFAULT 'delete'
                  CHECK (deletion_policy IN ('delete', 'orphan')),  -- 'orphan': forget, never delete
    status        TEXT NOT NULL CHECK (status IN ('ready', 'failed')),
    inputs_hash   TEXT NOT NULL,           -- sha256 of the resolved inputs: a change means update
    outputs       TEXT NOT NULL DEFAULT '{}',  -- JSON object of non-secret outputs
    inputs        TEXT NOT NULL DEFAULT '{}',  -- non-secret inputs last sent: {"values", "resource"}
    error         TEXT,                    -- the driver's last error while status = 'failed'
    commit_id     TEXT NOT NULL,           -- the commit it was last provisioned from
    deployment_id INTEGER NOT NULL REFERENCES deployment (id),
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL
);
CREATE INDEX resource_env ON resource (env, app, type);

-- Secret outputs of a resource (downstream resources need them) and the secret inputs last sent
-- (a delete sends them again). Nobody else reads them.
CREATE TABLE resource_secret (
    guresid TEXT PRIMARY KEY REFERENCES resource (guresid) ON DELETE CASCADE,
    outputs TEXT NOT NULL,                 -- JSON object
    inputs  TEXT NOT NULL DEFAULT '{}'     -- {"secrets"}, and "resource" when a secret flowed into it
);

-- Driver cookies (secret, opaque), kept from the first call on, even before the resource is
-- recorded, so a call repeated after a crash carries the same cookie. Cleared after a delete.
CREATE TABLE driver_cookie (
    guresid    TEXT PRIMARY KEY,
    cookie     TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

-- The edges of each environment's graph as last applied: from_guresid depends on to_guresid.
CREATE TABLE edge (
    env          TEXT NOT NULL,
    from_guresid TEXT NOT NULL,
    to_guresid   TEXT NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN
                     ('dependency', 'reference', 'coprovision', 'selector', 'implicit')),
    PRIMARY KEY (env, from_guresid, to_guresid)
);

-- Every operation on a resource, journalled before its first driver call and updated when it
-- ends. 'interrupted': gitplane stopped during it; the next apply calls the driver again.
CREATE TABLE operation (
    id            INTEGER PRIMARY KEY,
    deployment_id INTEGER NOT NULL REFERENCES deployment (id),
    guresid       TEXT NOT NULL,
    app           TEXT,
    type          TEXT NOT NULL,
    class         TEXT NOT NULL,
    res_id        TEXT NOT NULL,
    action        TEXT NOT NULL CHECK (action IN ('create', 'update', 'delete', 'forget')),
    reason        TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN
                      ('started', 'succeeded', 'failed', 'skipped', 'interrupted')),
    attempts      INTEGER NOT NULL DEFAULT 0,  -- driver calls made: polls and retries included
    error         TEXT,
    started_at    TEXT NOT NULL,
    finished_at   TEXT
);
CREATE INDEX operation_deployment ON operation (deployment_id);
CREATE INDEX operation_resource ON operation (guresid);

-- Current resources per environment, without secrets.
CREATE VIEW current_resources AS
SELECT env, app, type, class, res_id, guresid, definition, driver, status, outputs,
       commit_id, updated_at
FROM resource
ORDER BY env, app, type, class, res_id;

-- Deployments per commit, newest first, with counts and duration in seconds.
CREATE VIEW deployments AS
SELECT id, env, commit_id, kind, status, started_at, finished_at,
       created, updated, deleted, unchanged, failed,
       ROUND((julianday(finished_at) - julianday(started_at)) * 86400.0, 3) AS duration_s,
       error, held
FROM deployment
ORDER BY id DESC;

-- Every commit the daemon saw on the watched ref, and what it did with it.
CREATE TABLE commit_seen (
    id        INTEGER PRIMARY KEY,
    commit_id TEXT NOT NULL,
    seen_at   TEXT NOT NULL,
    outcome   TEXT NOT NULL CHECK (outcome IN ('dispatched', 'rejected')),
    detail    TEXT                         -- for a rejected commit: its errors
);

-- Commits seen, with the deployments made of them (none: superseded by a newer commit before
-- an environment got to it).
CREATE VIEW commits AS
SELECT c.id, c.commit_id, c.seen_at, c.outcome, c.detail,
       (SELECT group_concat(d.env || ':' || d.status, ' ') FROM deployment d
        WHERE d.commit_id = c.commit_id AND d.kind = 'commit') AS deployments
FROM commit_seen c
ORDER BY c.id DESC;

-- Operations that failed or were skipped, with their errors.
CREATE VIEW failures AS
SELECT o.deployment_id, d.env, d.commit_id, o.guresid, o.app, o.type, o.class, o.res_id,
       o.action, o.status, o.error, o.started_at, o.finished_at
FROM operation o JOIN deployment d ON d.id = o.deployment_id
WHERE o.status IN ('failed', 'skipped')
ORDER BY o.id DESC;
