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

-- migration 2

-- State grows with changes, not with deployments. Links, bindings and resource versions are rows
-- valid from the deployment that made them (`valid_from`) until the first deployment of the same
-- environment without them (`valid_to`; NULL while current). A deployment that changes nothing
-- writes its own `deployment` row and nothing else.
--
-- What an environment looked like at deployment D is every row of D's environment with
-- `valid_from <= D AND (valid_to IS NULL OR valid_to > D)`: the views `deployment_resources`,
-- `deployment_links` and `deployment_bindings` give it; `changes` lists what each deployment
-- added, changed and removed. `history.keep` in the host config prunes what no kept deployment
-- can see (`gitplane state vacuum`).
--
-- Existing per-deployment copies are folded into ranges: a link or binding present in a run of
-- consecutive deployments (among those that recorded links) becomes one row.

DROP VIEW links;
DROP VIEW consumers;

CREATE TABLE link_range (
    id          INTEGER PRIMARY KEY,
    env         TEXT NOT NULL,
    consumer    TEXT NOT NULL,             -- GUResID: depends on the provider
    provider    TEXT NOT NULL,             -- GUResID
    kind        TEXT NOT NULL CHECK (kind IN
                    ('dependency', 'reference', 'coprovision', 'selector', 'implicit')),
    update_type TEXT NOT NULL CHECK (update_type IN ('NeedsProvides', 'None', 'Insert')),
    valid_from  INTEGER NOT NULL,          -- the deployment that made this link
    valid_to    INTEGER                    -- the first deployment without it; NULL: current
);

CREATE TEMP TABLE link_runs AS
SELECT env, deployment_id,
       ROW_NUMBER() OVER (PARTITION BY env ORDER BY deployment_id) AS seq
FROM (SELECT DISTINCT env, deployment_id FROM link);

INSERT INTO link_range (env, consumer, provider, kind, update_type, valid_from, valid_to)
WITH numbered AS (
    SELECT l.env, l.consumer, l.provider, l.kind, l.update_type, r.seq,
           r.seq - ROW_NUMBER() OVER (
               PARTITION BY l.env, l.consumer, l.provider, l.kind, l.update_type
               ORDER BY r.seq) AS island
    FROM link l JOIN link_runs r ON r.env = l.env AND r.deployment_id = l.deployment_id
), islands AS (
    SELECT env, consumer, provider, kind, update_type, MIN(seq) AS first, MAX(seq) AS last
    FROM numbered
    GROUP BY env, consumer, provider, kind, update_type, island
)
SELECT i.env, i.consumer, i.provider, i.kind, i.update_type, f.deployment_id, n.deployment_id
FROM islands i
JOIN link_runs f ON f.env = i.env AND f.seq = i.first
LEFT JOIN link_runs n ON n.env = i.env AND n.seq = i.last + 1
ORDER BY f.deployment_id;

-- Edges that no link recorded (those of orphans kept after a failed deletion) join the current
-- links, from the environment's newest deployment on.
INSERT INTO link_range (env, consumer, provider, kind, update_type, valid_from, valid_to)
SELECT e.env, e.from_guresid, e.to_guresid, e.kind,
       CASE WHEN e.kind IN ('reference', 'selector') THEN 'NeedsProvides' ELSE 'None' END,
       COALESCE((SELECT MAX(id) FROM deployment d WHERE d.env = e.env), 0), NULL
FROM edge e
WHERE NOT EXISTS (SELECT 1 FROM link_range l
                  WHERE l.env = e.env AND l.consumer = e.from_guresid
                    AND l.provider = e.to_guresid AND l.valid_to IS NULL);

CREATE TABLE binding_range (
    id               INTEGER PRIMARY KEY,
    env              TEXT NOT NULL,
    needed_guresid   TEXT NOT NULL,        -- the consumer
    needed_path      TEXT NOT NULL,        -- where in its inputs: values.host, secrets.password, ...
    provided_guresid TEXT NOT NULL,        -- the provider (a selector's base resource)
    provided_path    TEXT NOT NULL,        -- outputs.pghost, or workload>aws-policy.outputs.name
    data_type        TEXT NOT NULL CHECK (data_type IN ('string', 'int', 'bool', 'json')),
    value            TEXT,                 -- JSON; NULL for a secret
    secret           INTEGER NOT NULL DEFAULT 0,
    inserted         INTEGER NOT NULL DEFAULT 0,  -- a whole object inserted into a string
    interface        TEXT,                 -- read through an interface: "NAME = $id"
    valid_from       INTEGER NOT NULL,
    valid_to         INTEGER
);

CREATE TEMP TABLE binding_runs AS
SELECT env, deployment_id,
       ROW_NUMBER() OVER (PARTITION BY env ORDER BY deployment_id) AS seq
FROM (SELECT DISTINCT env, deployment_id FROM binding);

INSERT INTO binding_range (env, needed_guresid, needed_path, provided_guresid, provided_path,
                           data_type, value, secret, inserted, interface, valid_from, valid_to)
WITH distinct_rows AS (
    SELECT DISTINCT env, deployment_id, needed_guresid, needed_path, provided_guresid,
           provided_path, data_type, value, secret, inserted, interface
    FROM binding
), numbered AS (
    SELECT b.*, r.seq,
           r.seq - ROW_NUMBER() OVER (
               PARTITION BY b.env, b.needed_guresid, b.needed_path, b.provided_guresid,
                            b.provided_path, b.data_type, b.value, b.secret, b.inserted,
                            b.interface
               ORDER BY r.seq) AS island
    FROM distinct_rows b JOIN binding_runs r ON r.env = b.env AND r.deployment_id = b.deployment_id
), islands AS (
    SELECT env, needed_guresid, needed_path, provided_guresid, provided_path, data_type, value,
           secret, inserted, interface, MIN(seq) AS first, MAX(seq) AS last
    FROM numbered
    GROUP BY env, needed_guresid, needed_path, provided_guresid, provided_path, data_type, value,
             secret, inserted, interface, island
)
SELECT i.env, i.needed_guresid, i.needed_path, i.provided_guresid, i.provided_path, i.data_type,
       i.value, i.secret, i.inserted, i.interface, f.deployment_id, n.deployment_id
FROM islands i
JOIN binding_runs f ON f.env = i.env AND f.seq = i.first
LEFT JOIN binding_runs n ON n.env = i.env AND n.seq = i.last + 1
ORDER BY f.deployment_id;

DROP TABLE link_runs;
DROP TABLE binding_runs;
DROP TABLE link;
DROP TABLE binding;
DROP TABLE edge;
ALTER TABLE link_range RENAME TO link;
ALTER TABLE binding_range RENAME TO binding;

CREATE UNIQUE INDEX link_current ON link (env, consumer, provider) WHERE valid_to IS NULL;
CREATE INDEX link_current_provider ON link (provider) WHERE valid_to IS NULL;
CREATE INDEX link_from ON link (env, valid_from);
CREATE INDEX link_to ON link (valid_to) WHERE valid_to IS NOT NULL;
CREATE INDEX binding_current ON binding (needed_guresid) WHERE valid_to IS NULL;
CREATE INDEX binding_from ON binding (env, valid_from);
CREATE INDEX binding_to ON binding (valid_to) WHERE valid_to IS NOT NULL;

-- The versions of each resource that ended: a new version starts whenever what a resource is
-- changes (its definition, driver, status, inputs, outputs or error), none when a run leaves it
-- as it was. The current version is the `resource` row itself, valid since its `version_from`;
-- the view `resource_versions` has both.
ALTER TABLE resource ADD COLUMN version_from INTEGER;  -- the deployment that made this version
UPDATE resource SET version_from = deployment_id;
CREATE TABLE resource_version (
    id          INTEGER PRIMARY KEY,
    guresid     TEXT NOT NULL,
    env         TEXT NOT NULL,
    app         TEXT,
    type        TEXT NOT NULL,
    class       TEXT NOT NULL,
    res_id      TEXT NOT NULL,
    definition  TEXT NOT NULL,
    driver      TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('ready', 'failed')),
    inputs_hash TEXT NOT NULL,
    outputs     TEXT NOT NULL,             -- JSON object of non-secret outputs
    error       TEXT,
    commit_id   TEXT NOT NULL,
    valid_from  INTEGER NOT NULL,
    valid_to    INTEGER NOT NULL
);
CREATE INDEX resource_version_of ON resource_version (guresid, valid_to);
CREATE INDEX resource_version_from ON resource_version (env, valid_from);
CREATE INDEX resource_version_to ON resource_version (valid_to);

-- Orphans kept are few: their own index keeps marking them cheap.
CREATE INDEX resource_orphans ON resource (env) WHERE orphan_since IS NOT NULL;

-- Every version of every resource: those that ended, and the current ones (`valid_to` NULL).
CREATE VIEW resource_versions AS
SELECT guresid, env, app, type, class, res_id, definition, driver, status, inputs_hash, outputs,
       error, commit_id, valid_from, valid_to
FROM resource_version
UNION ALL
SELECT guresid, env, app, type, class, res_id, definition, driver, status, inputs_hash, outputs,
       error, commit_id, COALESCE(version_from, deployment_id), NULL
FROM resource;

-- The edges of each environment's graph as last applied (`from_guresid` depends on
-- `to_guresid`): the current links, under the name of the table this view replaces.
CREATE VIEW edge AS
SELECT env, consumer AS from_guresid, provider AS to_guresid, kind
FROM link WHERE valid_to IS NULL;

-- The current links of each environment with their current bindings (one row per binding; a
-- link without bindings has NULL binding columns). `deployment_id` is the deployment that made
-- the link.
CREATE VIEW links AS
SELECT l.env, l.valid_from AS deployment_id,
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
LEFT JOIN binding b ON b.valid_to IS NULL AND b.needed_guresid = l.consumer
                   AND (b.provided_guresid = l.provider
                        OR (l.kind = 'selector'
                            AND substr(b.provided_path,
                                       max(instr(b.provided_path, '>'), instr(b.provided_path, '<')) + 1,
                                       instr(b.provided_path, '.outputs')
                                         - max(instr(b.provided_path, '>'), instr(b.provided_path, '<')) - 1)
                                = p.type))
WHERE l.valid_to IS NULL
ORDER BY l.env, l.consumer, l.provider, b.needed_path;

-- Everything that depends on each resource, transitively, from the current links: `provider`
-- is used by `consumer` through `depth` links.
CREATE VIEW consumers AS
WITH RECURSIVE current_link (env, consumer, provider) AS (
    SELECT env, consumer, provider FROM link WHERE valid_to IS NULL
), closure (env, provider, consumer, depth) AS (
    SELECT env, provider, consumer, 1 FROM current_link
    UNION
    SELECT c.env, c.provider, l.consumer, c.depth + 1
    FROM closure c JOIN current_link l ON l.env = c.env AND l.provider = c.consumer
    WHERE c.depth < 64
)
SELECT env, provider, consumer, MIN(depth) AS depth FROM closure
GROUP BY env, provider, consumer;

-- What each deployment's environment looked like when it ended: its resources (the version of
-- each in force), links and bindings. Ask for one: `WHERE deployment_id = D`.
CREATE VIEW deployment_resources AS
SELECT d.id AS deployment_id, d.env, d.commit_id AS deployment_commit,
       v.guresid, v.app, v.type, v.class, v.res_id, v.definition, v.driver, v.status,
       v.inputs_hash, v.outputs, v.error, v.commit_id, v.valid_from
FROM deployment d
JOIN resource_version v ON v.env = d.env AND v.valid_from <= d.id AND v.valid_to > d.id
UNION ALL
SELECT d.id, d.env, d.commit_id,
       r.guresid, r.app, r.type, r.class, r.res_id, r.definition, r.driver, r.status,
       r.inputs_hash, r.outputs, r.error, r.commit_id, COALESCE(r.version_from, r.deployment_id)
FROM deployment d
JOIN resource r ON r.env = d.env AND COALESCE(r.version_from, r.deployment_id) <= d.id;

CREATE VIEW deployment_links AS
SELECT d.id AS deployment_id, d.env, d.commit_id,
       l.consumer, l.provider, l.kind, l.update_type, l.valid_from
FROM deployment d
JOIN link l ON l.env = d.env AND l.valid_from <= d.id AND (l.valid_to IS NULL OR l.valid_to > d.id);

CREATE VIEW deployment_bindings AS
SELECT d.id AS deployment_id, d.env, d.commit_id,
       b.needed_guresid, b.needed_path, b.provided_guresid, b.provided_path, b.data_type,
       b.value, b.secret, b.inserted, b.interface, b.valid_from
FROM deployment d
JOIN binding b ON b.env = d.env AND b.valid_from <= d.id
              AND (b.valid_to IS NULL OR b.valid_to > d.id);

-- What each deployment changed: resources created, updated and deleted (a new version, a first
-- one, or the last one ending), links and bindings added and removed. `subject` is the resource
-- (a link's or binding's consumer), `other` a link's or binding's provider, `detail` what it
-- is. What changed in commit C: `WHERE commit_id = C`.
CREATE VIEW changes AS
SELECT d.id AS deployment_id, d.env, d.commit_id, 'resource' AS what,
       CASE WHEN EXISTS (SELECT 1 FROM resource_version p
                         WHERE p.guresid = v.guresid AND p.valid_to = v.valid_from)
            THEN 'updated' ELSE 'created' END AS change,
       v.guresid AS subject, NULL AS other,
       v.type || '.' || v.class || '#' || v.res_id AS detail
FROM deployment d JOIN resource_versions v ON v.env = d.env AND v.valid_from = d.id
UNION ALL
SELECT d.id, d.env, d.commit_id, 'resource', 'deleted', v.guresid, NULL,
       v.type || '.' || v.class || '#' || v.res_id
FROM deployment d JOIN resource_version v ON v.env = d.env AND v.valid_to = d.id
WHERE NOT EXISTS (SELECT 1 FROM resource_versions n
                  WHERE n.guresid = v.guresid AND n.valid_from = v.valid_to)
UNION ALL
SELECT d.id, d.env, d.commit_id, 'link', 'added', l.consumer, l.provider,
       l.kind || ' ' || l.update_type
FROM deployment d JOIN link l ON l.env = d.env AND l.valid_from = d.id
UNION ALL
SELECT d.id, d.env, d.commit_id, 'link', 'removed', l.consumer, l.provider,
       l.kind || ' ' || l.update_type
FROM deployment d JOIN link l ON l.env = d.env AND l.valid_to = d.id
UNION ALL
SELECT d.id, d.env, d.commit_id, 'binding', 'added', b.needed_guresid, b.provided_guresid,
       b.needed_path || ' <- ' || b.provided_path || ' = ' || COALESCE(b.value, '(secret)')
FROM deployment d JOIN binding b ON b.env = d.env AND b.valid_from = d.id
UNION ALL
SELECT d.id, d.env, d.commit_id, 'binding', 'removed', b.needed_guresid, b.provided_guresid,
       b.needed_path || ' <- ' || b.provided_path || ' = ' || COALESCE(b.value, '(secret)')
FROM deployment d JOIN binding b ON b.env = d.env AND b.valid_to = d.id;

-- migration 3

-- gitplane's own bookkeeping, not a report: what each app's part of an environment's graph was
-- made of when a deployment last left all of it ready (every resource provisioned, none failed,
-- pinned or kept as an orphan, none reading a secret store). A later commit that gives the same
-- fingerprint changes nothing there, so gitplane neither reads, builds nor plans that app.
CREATE TABLE app_fingerprint (
    env           TEXT NOT NULL,
    app           TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,           -- digest of the app folder's tree id, the ids of
                                           -- everything shared (definitions, the environment
                                           -- file, settings) and gitplane's version
    deployment_id INTEGER NOT NULL,        -- the deployment that recorded it
    resources     INTEGER NOT NULL,        -- how many resources the app has
    PRIMARY KEY (env, app)
);

-- migration 4

-- A held deployment that a newer commit overtook is closed as 'superseded' (approving it would
-- put an old commit over a newer one). Each deployment of a commit records the deletion guard's
-- threshold its commit sets: the next commit is judged by the threshold in force, never by one
-- it raises itself. SQLite cannot widen a CHECK constraint in place, so the table is rebuilt
-- (gitplane runs this with foreign keys off and checks them before it commits).
CREATE TABLE deployment_v4 (
    id          INTEGER PRIMARY KEY,
    env         TEXT NOT NULL,
    commit_id   TEXT,                      -- NULL when the revision itself could not be read
    kind        TEXT NOT NULL DEFAULT 'commit' CHECK (kind IN ('commit', 'drift')),
                                           -- 'drift': a scheduled re-apply of the last good commit
    status      TEXT NOT NULL
                CHECK (status IN ('running', 'succeeded', 'failed', 'held', 'superseded')),
                                           -- 'superseded': held, then overtaken by a newer commit
    started_at  TEXT NOT NULL,
    finished_at TEXT,                      -- NULL while running
    created     INTEGER NOT NULL DEFAULT 0,
    updated     INTEGER NOT NULL DEFAULT 0,
    deleted     INTEGER NOT NULL DEFAULT 0,
    unchanged   INTEGER NOT NULL DEFAULT 0,
    failed      INTEGER NOT NULL DEFAULT 0,
    error       TEXT,                      -- why a failed deployment failed (load, build, drivers),
                                           -- or which deployment superseded a held one
    held        TEXT,                      -- while held by the deletion guard: JSON array of the
                                           -- resources it would delete
    deletion_threshold REAL                -- the commit's deletion guard threshold (percent);
                                           -- NULL when the commit did not build
);
INSERT INTO deployment_v4 (id, env, commit_id, kind, status, started_at, finished_at, created,
                           updated, deleted, unchanged, failed, error, held)
SELECT id, env, commit_id, kind, status, started_at, finished_at, created, updated, deleted,
       unchanged, failed, error, held
FROM deployment;
DROP TABLE deployment;
ALTER TABLE deployment_v4 RENAME TO deployment;
CREATE INDEX deployment_env ON deployment (env, id);

-- Which process applies to which environment of this state file. The lock lives in the file
-- itself, so every name of the file (a symlink, a hard link, a relative path) finds the same
-- one. A holder renews `renewed_at` while it works; a lock whose holder process is gone (same
-- host) or that was not renewed for 30 seconds is taken over.
CREATE TABLE env_lock (
    env         TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,             -- a token unique to the holding lock
    pid         INTEGER NOT NULL,
    host        TEXT NOT NULL,
    acquired_at TEXT NOT NULL,
    renewed_at  TEXT NOT NULL
);

-- migration 5

-- Secret outputs and inputs and driver cookies are sealed with the host's state key
-- (XChaCha20-Poly1305; `gp1:<key id>:<nonce and ciphertext in hex>`), so a copy of the file
-- without its key shows none of them. Values written before are sealed now. `gp_seal` is a
-- function gitplane gives the connection; nothing else can read these columns.
UPDATE resource_secret
SET outputs = gp_seal(outputs, 'resource_secret.outputs:' || guresid),
    inputs = gp_seal(inputs, 'resource_secret.inputs:' || guresid)
WHERE outputs NOT LIKE 'gp1:%';
UPDATE driver_cookie SET cookie = gp_seal(cookie, 'driver_cookie:' || guresid)
WHERE cookie NOT LIKE 'gp1:%';

-- migration 6

-- The Kubernetes manifests each resource's driver produced when it was last provisioned, applied
-- with the deployment of the workloads that use it (`gitplane manifests`). `manifests` is a JSON
-- list of `{"name", "location", "data"}` with every secret value replaced by `(secret)`; `sealed`
-- is the same list with them, sealed like the secrets (NULL when nothing was hidden).
CREATE TABLE resource_manifest (
    guresid   TEXT PRIMARY KEY REFERENCES resource (guresid) ON DELETE CASCADE,
    manifests TEXT NOT NULL,
    sealed    TEXT
);

-- migration 7

-- Several daemons can share one state in PostgreSQL. Each environment is reconciled by one of
-- them at a time: the daemon holding its lease. The holder renews `expires_at` while it lives;
-- another daemon takes a lease that expired, with the next `generation`, and every write of
-- the old holder (each carries the generation it holds) is refused from then on. Rows are
-- never deleted, so a generation is never given twice. SQLite states have no leases.
CREATE TABLE env_lease (
    env         TEXT PRIMARY KEY,
    daemon      TEXT NOT NULL,             -- the holding daemon's id (see `daemon`); '' once given up
    generation  INTEGER NOT NULL,          -- 1 for the first holder, +1 at each takeover
    acquired_at TEXT NOT NULL,
    expires_at  TEXT NOT NULL              -- renewed by the holder's heartbeat
);

-- The daemons sharing the state, as each last reported itself: each takes at most its share
-- of the environments (how many there are, divided by the daemons seen within a lease's time).
CREATE TABLE daemon (
    id         TEXT PRIMARY KEY,           -- host:pid
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    seen_at    TEXT NOT NULL
);

-- The lease generation a daemon took an apply lock under (NULL: a command took it): the
-- daemon that took the lease over breaks a lock of an older generation at once, since every
-- write its holder could still make is refused.
ALTER TABLE env_lock ADD COLUMN generation INTEGER;

-- migration 8

-- Environments made per branch (`previews:` in the host config): one for each branch the
-- pattern matches, deployed from the branch's head on every push, and emptied (every resource
-- deleted) when the branch is deleted or `ttl` passes without a push. Commits of the watched ref
-- never deploy, nor remove, a preview environment.
CREATE TABLE preview (
    env         TEXT PRIMARY KEY,          -- made from the branch name: `pr-7`
    branch      TEXT NOT NULL,             -- the full ref: `refs/heads/pr-7`
    env_type    TEXT NOT NULL,             -- `previews.type`: it chooses the definitions
    commit_id   TEXT,                      -- the branch head last dispatched
    created_at  TEXT NOT NULL,
    pushed_at   TEXT NOT NULL,             -- when its head last changed: the ttl runs from here
    removing_at TEXT,                      -- when removal began (branch deleted or ttl passed)
    removed_at  TEXT,                      -- when its last resource was deleted
    removed_why TEXT                       -- 'branch deleted' or 'ttl expired'
);

-- An environment held at an earlier commit by `gitplane rollback`, with who and why. While a pin
-- holds (`unpinned_at` NULL) commits of the watched ref are planned, and the newest one is
-- recorded here, but not applied; `gitplane unpin` releases it. Rows stay as history.
CREATE TABLE env_pin (
    env            TEXT NOT NULL,
    pinned_at      TEXT NOT NULL,
    commit_id      TEXT NOT NULL,          -- the commit the environment is held at
    pinned_by      TEXT NOT NULL,
    reason         TEXT NOT NULL,
    deployment_id  INTEGER,                -- the rollback's deployment (NULL until it started)
    unpinned_by    TEXT,
    unpinned_at    TEXT,
    waiting_commit TEXT,                   -- the newest commit held back while pinned
    waiting_plan   TEXT,                   -- its plan against the pinned state, as JSON counts
    PRIMARY KEY (env, pinned_at)
);
CREATE UNIQUE INDEX env_pin_held ON env_pin (env) WHERE unpinned_at IS NULL;

-- What a detect-only drift run found (environment `drift: detect`): the run reads each resource
-- through its driver's read path, or compares what it would now send with what was recorded,
-- and records each difference here instead of changing anything. Secret values never appear:
-- a secret output that differs is named, not shown.
ALTER TABLE deployment ADD COLUMN drift_mode TEXT;  -- 'detect' for a run that only looked
CREATE TABLE drift_finding (
    deployment_id INTEGER NOT NULL,        -- the detect run
    env           TEXT NOT NULL,
    guresid       TEXT NOT NULL,
    app           TEXT,
    type          TEXT NOT NULL,
    class         TEXT NOT NULL,
    res_id        TEXT NOT NULL,
    source        TEXT NOT NULL,           -- 'driver' (its read path) or 'recorded'
    what          TEXT NOT NULL,           -- 'outputs', 'secret outputs', 'missing' or 'inputs'
    detail        TEXT NOT NULL,           -- which paths differ, with the public values
    PRIMARY KEY (deployment_id, guresid, what)
);
CREATE INDEX drift_finding_env ON drift_finding (env, deployment_id);

-- The `drift` view (migration 1) speaks of runs that corrected: a detect run, which changed
-- nothing, must not hide what the last correcting run repaired.
DROP VIEW drift;
CREATE VIEW drift AS
SELECT d.env, r.app, r.type, r.class, r.res_id, o.guresid, d.id AS deployment_id,
       d.commit_id, o.finished_at
FROM operation o
JOIN deployment d ON d.id = o.deployment_id
LEFT JOIN resource r ON r.guresid = o.guresid
WHERE d.kind = 'drift' AND d.drift_mode IS NULL AND o.status = 'succeeded'
  AND o.outputs_changed = 1
  AND d.id = (SELECT MAX(d2.id) FROM deployment d2
              WHERE d2.env = d.env AND d2.kind = 'drift' AND d2.drift_mode IS NULL
                AND d2.status != 'running')
ORDER BY d.env, r.app, r.type, r.res_id;

-- What the newest finished detect run of each environment found.
CREATE VIEW drift_detected AS
SELECT f.env, f.app, f.type, f.class, f.res_id, f.guresid, f.what, f.source, f.detail,
       d.id AS deployment_id, d.commit_id, d.finished_at
FROM drift_finding f
JOIN deployment d ON d.id = f.deployment_id
WHERE d.id = (SELECT MAX(d2.id) FROM deployment d2
              WHERE d2.env = f.env AND d2.kind = 'drift' AND d2.drift_mode = 'detect'
                AND d2.status != 'running')
ORDER BY f.env, f.app, f.type, f.res_id, f.what;

-- migration 9

-- Trust boundaries. The repository a state belongs to: recorded the first time a daemon or
-- command reads one with it, so a daemon or command reading another repository is refused
-- instead of deploying that repository's commits over these environments. One row.
CREATE TABLE repository (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    root_commit TEXT NOT NULL,             -- the root commit of the watched ref's history
    url         TEXT NOT NULL,             -- where it was read from (a path or a URL, no credentials)
    recorded_at TEXT NOT NULL
);

-- A known text sealed with the state key when the key is first used: a daemon whose key cannot
-- open it refuses to start (and takes no lease), without opening any real secret. One row.
CREATE TABLE key_canary (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    sealed    TEXT NOT NULL,               -- `gp1:<key id>:...`, resealed by `state rekey`
    sealed_at TEXT NOT NULL
);

-- Who changed the state by hand, from where: every command that changes state (apply,
-- approve, rollback, unpin, resolve, state vacuum, state rekey, ...) adds a row.
CREATE TABLE action (
    at            TEXT NOT NULL,
    command       TEXT NOT NULL,           -- `approve`, `rollback`, `state rekey`, ...
    env           TEXT,                    -- NULL for what concerns the whole state
    actor         TEXT NOT NULL,           -- --by, else the login name of the uid, else `uid:N`
    host          TEXT NOT NULL,           -- the host it ran on
    deployment_id INTEGER,                 -- the deployment it started or released, if any
    detail        TEXT                     -- what it did, in words (never a secret)
);
CREATE INDEX action_env ON action (env, at);

-- A rollback to a commit outside the watched ref's history (and never deployed to the
-- environment) needs --force, recorded with its pin.
ALTER TABLE env_pin ADD COLUMN forced INTEGER NOT NULL DEFAULT 0;

-- Previews are built from the branch's `workloads/` and the watched ref's platform (everything
-- else), unless `previews.trust: branch`. The watched ref's commit a preview's platform came
-- from, and the newest branch head that was not deployed with why (it changes files outside
-- `workloads/`, say), for `gitplane status`.
ALTER TABLE preview ADD COLUMN platform_commit TEXT;
ALTER TABLE preview ADD COLUMN refused_commit TEXT;
ALTER TABLE preview ADD COLUMN refused_why TEXT;

-- migration 10

-- The daemon retries a deployment that did not finish (a driver error, a state error, cut
-- short) with a backoff, until it succeeds or a newer commit arrives (`retry.deployments`):
-- which attempt at its commit each deployment was. 1: the first; 2: the first retry.
ALTER TABLE deployment ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;

-- migration 11

-- `gitplane reconcile`: a person asks the running daemons to look now (fetch the remote, read
-- the watched ref) and to deploy an environment's current commit if it is not deployed (a
-- failed deployment waiting for its retry runs at once), rather than at their next look. The
-- daemon that deploys the environment answers once: what it did, at which commit, and the
-- environment's newest deployment at that moment, so that `--wait` knows the deployment to wait
-- for is a later one. Rows older than a day are deleted by the daemons.
CREATE TABLE reconcile_request (
    id               TEXT PRIMARY KEY,     -- made by the command
    env              TEXT,                 -- NULL: look at the repository only
    requested_by     TEXT NOT NULL,
    requested_at     TEXT NOT NULL,
    answered_by      TEXT,                 -- the daemon that answered (`daemon.id`)
    answered_at      TEXT,
    commit_id        TEXT,                 -- the watched ref's commit the daemon looked at
    action           TEXT,                 -- 'deploying', 'up to date', 'pinned', 'held',
                                           -- 'waiting', 'preview', 'unknown', 'looked'
    after_deployment INTEGER,              -- 'deploying': the environment's newest deployment then
    detail           TEXT                  -- why, in words
);
CREATE INDEX reconcile_request_open ON reconcile_request (answered_at, requested_at);

-- migration 12

-- The status page answers one app's graph from indexes: the environment's resources counted
-- by type, its failed resources, and the creates the newest deployment missed (its ghosts)
-- are found without reading every row of the environment or of the deployment. The type
-- comes first so that no query of one environment's resources prefers this index to those
-- it seeks through (`resource_orphans` above all).
CREATE INDEX resource_type_env ON resource (type, env);
CREATE INDEX resource_failed ON resource (env) WHERE status = 'failed';
CREATE INDEX operation_missed ON operation (deployment_id)
    WHERE action = 'create' AND status IN ('failed', 'skipped', 'interrupted');

-- migration 13

-- gitplane's own bookkeeping, not a report: which apps of an environment had resources but no
-- fingerprint when deployment `deployment_id` ended, and a digest of the fingerprints it left.
-- While that deployment is the environment's newest, a deployment finds those apps here instead
-- of reading every resource row of the environment, and a commit whose fingerprints give the
-- same digest is known to change nothing without reading the fingerprints one by one. A
-- surgery by hand deletes the row; with no row, or an older deployment, both are read again
-- from `resource` and `app_fingerprint`.
CREATE TABLE app_census (
    env           TEXT PRIMARY KEY,
    deployment_id INTEGER NOT NULL,        -- the deployment at whose end they were counted
    unprinted     TEXT NOT NULL,           -- JSON array of those apps' names, most often `[]`
    digest        TEXT,                    -- SHA-256 of the `app_fingerprint` rows of `env`
                                           -- (NULL: not known)
    resources     INTEGER                  -- the sum of their `resources`
);

-- migration 14

-- sqlite only
-- SQLite checks `x IN ('a', 'b', 'c')` by building a table of the list for every row it writes
-- (a list of up to two values it compares in place): a first apply of tens of thousands of
-- resources spent a tenth of its writing on such tables, for the operations, bindings and links
-- it records. The same checks written as comparisons cost nothing of the kind. PostgreSQL
-- compares a list in place, so its tables keep theirs and it skips this migration. SQLite
-- cannot change a CHECK constraint in place, so the tables are rebuilt (gitplane runs this with
-- foreign keys off and checks them before it commits).
CREATE TABLE operation_v14 (
    id            INTEGER PRIMARY KEY,
    deployment_id INTEGER NOT NULL REFERENCES deployment (id),
    guresid       TEXT NOT NULL,
    app           TEXT,
    type          TEXT NOT NULL,
    class         TEXT NOT NULL,
    res_id        TEXT NOT NULL,
    action        TEXT NOT NULL CHECK (action = 'create' OR action = 'update'
                                       OR action = 'delete' OR action = 'forget'),
    reason        TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status = 'started' OR status = 'succeeded'
                                       OR status = 'failed' OR status = 'skipped'
                                       OR status = 'interrupted'),
    attempts      INTEGER NOT NULL DEFAULT 0,  -- driver calls made: polls and retries included
    outputs_changed INTEGER,               -- for a succeeded put: whether its outputs changed
    error         TEXT,
    started_at    TEXT NOT NULL,
    finished_at   TEXT
);
INSERT INTO operation_v14 (id, deployment_id, guresid, app, type, class, res_id, action, reason,
                           status, attempts, outputs_changed, error, started_at, finished_at)
SELECT id, deployment_id, guresid, app, type, class, res_id, action, reason, status, attempts,
       outputs_changed, error, started_at, finished_at
FROM operation;
DROP TABLE operation;
ALTER TABLE operation_v14 RENAME TO operation;
CREATE INDEX operation_deployment ON operation (deployment_id);
CREATE INDEX operation_resource ON operation (guresid);
CREATE INDEX operation_missed ON operation (deployment_id)
    WHERE action = 'create' AND (status = 'failed' OR status = 'skipped' OR status = 'interrupted');

CREATE TABLE link_v14 (
    id          INTEGER PRIMARY KEY,
    env         TEXT NOT NULL,
    consumer    TEXT NOT NULL,             -- GUResID: depends on the provider
    provider    TEXT NOT NULL,             -- GUResID
    kind        TEXT NOT NULL CHECK (kind = 'dependency' OR kind = 'reference'
                                     OR kind = 'coprovision' OR kind = 'selector'
                                     OR kind = 'implicit'),
    update_type TEXT NOT NULL CHECK (update_type = 'NeedsProvides' OR update_type = 'None'
                                     OR update_type = 'Insert'),
    valid_from  INTEGER NOT NULL,          -- the deployment that made this link
    valid_to    INTEGER                    -- the first deployment without it; NULL: current
);
INSERT INTO link_v14 (id, env, consumer, provider, kind, update_type, valid_from, valid_to)
SELECT id, env, consumer, provider, kind, update_type, valid_from, valid_to FROM link;
DROP TABLE link;
ALTER TABLE link_v14 RENAME TO link;
CREATE UNIQUE INDEX link_current ON link (env, consumer, provider) WHERE valid_to IS NULL;
CREATE INDEX link_current_provider ON link (provider) WHERE valid_to IS NULL;
CREATE INDEX link_from ON link (env, valid_from);
CREATE INDEX link_to ON link (valid_to) WHERE valid_to IS NOT NULL;

CREATE TABLE binding_v14 (
    id               INTEGER PRIMARY KEY,
    env              TEXT NOT NULL,
    needed_guresid   TEXT NOT NULL,        -- the consumer
    needed_path      TEXT NOT NULL,        -- where in its inputs: values.host, secrets.password, ...
    provided_guresid TEXT NOT NULL,        -- the provider (a selector's base resource)
    provided_path    TEXT NOT NULL,        -- outputs.pghost, or workload>aws-policy.outputs.name
    data_type        TEXT NOT NULL CHECK (data_type = 'string' OR data_type = 'int'
                                          OR data_type = 'bool' OR data_type = 'json'),
    value            TEXT,                 -- JSON; NULL for a secret
    secret           INTEGER NOT NULL DEFAULT 0,
    inserted         INTEGER NOT NULL DEFAULT 0,  -- a whole object inserted into a string
    interface        TEXT,                 -- read through an interface: "NAME = $id"
    valid_from       INTEGER NOT NULL,
    valid_to         INTEGER
);
INSERT INTO binding_v14 (id, env, needed_guresid, needed_path, provided_guresid, provided_path,
                         data_type, value, secret, inserted, interface, valid_from, valid_to)
SELECT id, env, needed_guresid, needed_path, provided_guresid, provided_path, data_type, value,
       secret, inserted, interface, valid_from, valid_to
FROM binding;
DROP TABLE binding;
ALTER TABLE binding_v14 RENAME TO binding;
CREATE INDEX binding_current ON binding (needed_guresid) WHERE valid_to IS NULL;
CREATE INDEX binding_from ON binding (env, valid_from);
CREATE INDEX binding_to ON binding (valid_to) WHERE valid_to IS NOT NULL;
