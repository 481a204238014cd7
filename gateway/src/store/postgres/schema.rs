//! The schema, as the migrations that bring a database up to date.

/// Schema migrations; applying `MIGRATIONS[i]` takes `berth_schema.version` from `i` to `i + 1`.
/// Append only: a released step is never edited, since databases already past it never rerun it.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE sandboxes (
    id      TEXT   NOT NULL PRIMARY KEY,
    name    TEXT   COLLATE "C" NOT NULL UNIQUE,
    version BIGINT NOT NULL,
    record  TEXT   NOT NULL
);

CREATE TABLE sandbox_providers (
    sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    provider   TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (sandbox_id, provider)
);
CREATE INDEX sandbox_providers_by_provider ON sandbox_providers (provider, sandbox_id);

CREATE TABLE sandbox_labels (
    sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, key)
);
CREATE INDEX sandbox_labels_by_pair ON sandbox_labels (key, value, sandbox_id);

CREATE TABLE providers (
    name    TEXT   COLLATE "C" NOT NULL PRIMARY KEY,
    version BIGINT NOT NULL,
    record  TEXT   NOT NULL
);
"#,
    r#"
CREATE TABLE leases (
    name       TEXT        NOT NULL PRIMARY KEY,
    holder     TEXT,
    term       BIGINT      NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
"#,
    r#"
CREATE TABLE store_identity (
    singleton BOOLEAN NOT NULL PRIMARY KEY CHECK (singleton),
    id        TEXT    NOT NULL
);
"#,
    r#"
CREATE TABLE execs (
    sandbox_id TEXT    NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    id         TEXT    COLLATE "C" NOT NULL,
    version    BIGINT  NOT NULL,
    open       BOOLEAN NOT NULL,
    record     TEXT    NOT NULL,
    PRIMARY KEY (sandbox_id, id)
);
CREATE INDEX execs_open ON execs (sandbox_id, id) WHERE open;
"#,
    r#"
CREATE TABLE templates (
    name    TEXT   COLLATE "C" NOT NULL PRIMARY KEY,
    version BIGINT NOT NULL,
    record  TEXT   NOT NULL
);
"#,
    // The change log: see `sequence`. `id` is the order entries were written in, `seq` the
    // position a sequencer gave them after they committed.
    r#"
CREATE TABLE sandbox_changes (
    id         BIGSERIAL PRIMARY KEY,
    seq        BIGINT UNIQUE,
    sandbox_id TEXT    NOT NULL,
    version    BIGINT  NOT NULL,
    removed    BOOLEAN NOT NULL,
    record     TEXT    NOT NULL
);
CREATE INDEX sandbox_changes_unsequenced ON sandbox_changes (id) WHERE seq IS NULL;
CREATE TABLE change_log (
    singleton       BOOLEAN NOT NULL PRIMARY KEY CHECK (singleton),
    head            BIGINT  NOT NULL,
    trimmed_through BIGINT  NOT NULL
);
INSERT INTO change_log (singleton, head, trimmed_through) VALUES (TRUE, 0, 0);
"#,
    // A condition that does not hold fails its transaction, saying what it found: see `plan`.
    r#"
CREATE FUNCTION berth_expect_version(current BIGINT, expected BIGINT) RETURNS VOID LANGUAGE plpgsql AS $$
BEGIN
    IF current IS DISTINCT FROM expected THEN
        RAISE EXCEPTION 'a record is not at the version its write expects'
            USING ERRCODE = 'BR001', DETAIL = coalesce(current::TEXT, '');
    END IF;
END
$$;
CREATE FUNCTION berth_expect_name_free(holder TEXT, version BIGINT, writer TEXT) RETURNS VOID LANGUAGE plpgsql AS $$
BEGIN
    IF holder <> writer THEN
        RAISE EXCEPTION 'the name a write gives its sandbox is taken'
            USING ERRCODE = 'BR002', DETAIL = version::TEXT || ' ' || holder;
    END IF;
END
$$;
CREATE FUNCTION berth_expect_rows(n BIGINT) RETURNS VOID LANGUAGE plpgsql AS $$
BEGIN
    IF n = 0 THEN
        RAISE EXCEPTION 'a conditional write changed no row' USING ERRCODE = 'BR003';
    END IF;
END
$$;
"#,
    // What the index tables hold for the row (see `index_key`); NULL until its next write.
    r#"
ALTER TABLE sandboxes ADD COLUMN indexed TEXT;
"#,
    r#"
CREATE TABLE snapshots (
    name    TEXT   COLLATE "C" NOT NULL PRIMARY KEY,
    version BIGINT NOT NULL,
    record  TEXT   NOT NULL
);
"#,
    r#"
CREATE TABLE volumes (
    name    TEXT   COLLATE "C" NOT NULL PRIMARY KEY,
    version BIGINT NOT NULL,
    record  TEXT   NOT NULL
);
"#,
    r#"
CREATE TABLE nodes (
    id         TEXT        COLLATE "C" NOT NULL PRIMARY KEY,
    holder     TEXT,
    epoch      BIGINT      NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    draining   BOOLEAN     NOT NULL,
    offer      TEXT        NOT NULL
);
"#,
    // As SQLite's: a deleted node's row stays, marked, its epochs going on if it comes back.
    r#"
ALTER TABLE nodes ADD COLUMN removed BOOLEAN NOT NULL DEFAULT FALSE;
"#,
    // As SQLite's: what each sandbox that counts reserves on its node, summed by node.
    r#"
CREATE TABLE sandbox_placements (
    sandbox_id   TEXT   NOT NULL PRIMARY KEY REFERENCES sandboxes (id) ON DELETE CASCADE,
    node         TEXT   COLLATE "C" NOT NULL,
    cpu_millis   BIGINT NOT NULL,
    memory_bytes BIGINT NOT NULL
);
CREATE INDEX sandbox_placements_by_node ON sandbox_placements (node, cpu_millis, memory_bytes);
"#,
];
