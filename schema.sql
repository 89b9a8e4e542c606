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
    template_hash TEXT NOT NULL DEFAULT '',  -- digest of its definition's templates: a change
                                             -- updates even a pinned resource
    orphan_since  TEXT,                    -- no longer in the graph but still recorded: since when
    orphan_reason TEXT,                    -- and why it is kept
    status        TEXT NOT NULL CHECK (status IN ('ready', 'failed')),
    inputs_hash   TEXT NOT NULL,           -- sha256 of the non-secret resolved inputs: a change means update
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
    outputs_changed INTEGER,               -- for a succeeded put: whether its outputs changed
    error         TEXT,
    started_at    TEXT NOT NULL,
    finished_at   TEXT
);
CREATE INDEX operation_deployment ON operation (deployment_id);
CREATE INDEX operation_resource ON operation (guresid);

-- Links (ConfigHub's model): for each deployment, every edge of the environment's graph, from the
-- consumer (downstream) to the provider (upstream), with how the consumer depends on it:
-- 'NeedsProvides' (it reads the provider's outputs: references, selectors), 'None' (ordering
-- alone: workload dependencies, co-provisioning, depends_on), 'Insert' (it inserts whole output
-- objects into strings).
CREATE TABLE link (
    deployment_id INTEGER NOT NULL REFERENCES deployment (id),
    env           TEXT NOT NULL,
    consumer      TEXT NOT NULL,           -- GUResID
    provider      TEXT NOT NULL,           -- GUResID
    kind          TEXT NOT NULL,           -- the edge kind: reference, selector, dependency, ...
    update_type   TEXT NOT NULL CHECK (update_type IN ('NeedsProvides', 'None', 'Insert')),
    PRIMARY KEY (deployment_id, consumer, provider)
);
CREATE INDEX link_provider ON link (provider);

-- Bindings: every placeholder resolved in a deployment: which value of which provider reached
-- which input of which consumer.
CREATE TABLE binding (
    id               INTEGER PRIMARY KEY,
    deployment_id    INTEGER NOT NULL REFERENCES deployment (id),
    env              TEXT NOT NULL,
    needed_guresid   TEXT NOT NULL,        -- the consumer
    needed_path      TEXT NOT NULL,        -- where in its inputs: values.host, secrets.password, ...
    provided_guresid TEXT NOT NULL,        -- the provider (a selector's base resource)
    provided_path    TEXT NOT NULL,        -- outputs.pghost, or workload>aws-policy.outputs.name
    data_type        TEXT NOT NULL CHECK (data_type IN ('string', 'int', 'bool', 'json')),
    value            TEXT,                 -- JSON; NULL for a secret
    secret           INTEGER NOT NULL DEFAULT 0,
    inserted         INTEGER NOT NULL DEFAULT 0,  -- a whole object inserted into a string
    interface        TEXT                  -- read through an interface: "NAME = $id", the
                                           -- consumer's name for the provider's output
);
CREATE INDEX binding_deployment ON binding (deployment_id, needed_guresid);

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

-- Recorded resources that are no longer in their environment's graph, and why they are kept.
CREATE VIEW orphans AS
SELECT env, app, type, class, res_id, guresid, definition, deletion_policy,
       orphan_since, orphan_reason
FROM resource
WHERE orphan_since IS NOT NULL
ORDER BY env, app, type, res_id;

-- Resources whose newest finished drift run changed their outputs: something outside gitplane had
-- changed them, and the driver set them back (or moved them on).
CREATE VIEW drift AS
SELECT d.env, r.app, r.type, r.class, r.res_id, o.guresid, d.id AS deployment_id,
       d.commit_id, o.finished_at
FROM operation o
JOIN deployment d ON d.id = o.deployment_id
LEFT JOIN resource r ON r.guresid = o.guresid
WHERE d.kind = 'drift' AND o.status = 'succeeded' AND o.outputs_changed = 1
  AND d.id = (SELECT MAX(d2.id) FROM deployment d2
              WHERE d2.env = d.env AND d2.kind = 'drift' AND d2.status != 'running')
ORDER BY d.env, r.app, r.type, r.res_id;

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

-- The links of each environment's newest deployment that recorded links, with their bindings
-- (one row per binding; a link without bindings has NULL binding columns).
CREATE VIEW links AS
SELECT l.env, l.deployment_id,
       l.consumer, c.type AS consumer_type, c.res_id AS consumer_id,
       l.provider, p.type AS provider_type, p.res_id AS provider_id,
       l.kind, l.update_type,
       b.needed_path, b.provided_path, b.data_type, b.value, b.secret, b.inserted, b.interface
FROM link l
LEFT JOIN resource c ON c.guresid = l.consumer
LEFT JOIN resource p ON p.guresid = l.provider
-- A selector's binding (an array) names the selector's base resource and a path such as
-- `workload>aws-policy.outputs.name`; it belongs to each of the selector's links to a resource
-- of the selected type.
LEFT JOIN binding b ON b.deployment_id = l.deployment_id AND b.needed_guresid = l.consumer
                   AND (b.provided_guresid = l.provider
                        OR (l.kind = 'selector'
                            AND substr(b.provided_path,
                                       max(instr(b.provided_path, '>'), instr(b.provided_path, '<')) + 1,
                                       instr(b.provided_path, '.outputs')
                                         - max(instr(b.provided_path, '>'), instr(b.provided_path, '<')) - 1)
                                = p.type))
WHERE l.deployment_id = (SELECT MAX(deployment_id) FROM link l2 WHERE l2.env = l.env)
ORDER BY l.env, l.consumer, l.provider, b.needed_path;

-- Everything that depends on each resource, transitively, from the current links: `provider`
-- is used by `consumer` through `depth` links.
CREATE VIEW consumers AS
WITH RECURSIVE current_link (env, consumer, provider) AS (
    SELECT env, consumer, provider FROM link l
    WHERE l.deployment_id = (SELECT MAX(deployment_id) FROM link l2 WHERE l2.env = l.env)
), closure (env, provider, consumer, depth) AS (
    SELECT env, provider, consumer, 1 FROM current_link
    UNION
    SELECT c.env, c.provider, l.consumer, c.depth + 1
    FROM closure c JOIN current_link l ON l.env = c.env AND l.provider = c.consumer
    WHERE c.depth < 64
)
SELECT env, provider, consumer, MIN(depth) AS depth FROM closure
GROUP BY env, provider, consumer;

-- Operations that failed or were skipped, with their errors.
CREATE VIEW failures AS
SELECT o.deployment_id, d.env, d.commit_id, o.guresid, o.app, o.type, o.class, o.res_id,
       o.action, o.status, o.error, o.started_at, o.finished_at
FROM operation o JOIN deployment d ON d.id = o.deployment_id
WHERE o.status IN ('failed', 'skipped')
ORDER BY o.id DESC;
