//! ClickHouse DDL as versioned migration files (`schemas/clickhouse/NNNN_name.sql`).
//!
//! The files are embedded so the binary carries its own schema. Applying them is the
//! consumer crate's job (`weft migrate`); this module only parses and orders them.
//! Convention: statements are separated by a `;` that ends a line; `--` comments are allowed.

use include_dir::{include_dir, Dir};

static DIR: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/clickhouse");

/// One migration file.
#[derive(Debug, Clone)]
pub struct Migration {
    /// The `NNNN` prefix; applied in ascending order, recorded once applied.
    pub version: u32,
    /// The rest of the file stem, for humans.
    pub name: String,
    /// The file text (hashed to detect an edited, already-applied migration).
    pub sql: &'static str,
}

impl Migration {
    /// The statements of this migration, comments and blank lines removed.
    pub fn statements(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut cur = String::new();
        for line in self.sql.lines() {
            let code = line.split("--").next().unwrap_or("").trim_end();
            if code.trim().is_empty() {
                continue;
            }
            cur.push_str(code);
            cur.push('\n');
            if code.ends_with(';') {
                let stmt = cur.trim().trim_end_matches(';').trim().to_owned();
                if !stmt.is_empty() {
                    out.push(stmt);
                }
                cur.clear();
            }
        }
        if !cur.trim().is_empty() {
            out.push(cur.trim().to_owned());
        }
        out
    }
}

/// All migrations, ordered by version. Files not named `NNNN_*.sql` are ignored.
pub fn all() -> Vec<Migration> {
    let mut v: Vec<Migration> = DIR
        .files()
        .filter_map(|f| {
            let name = f.path().file_name()?.to_str()?;
            let stem = name.strip_suffix(".sql")?;
            let (num, rest) = stem.split_once('_')?;
            Some(Migration {
                version: num.parse().ok()?,
                name: rest.to_owned(),
                sql: f.contents_utf8()?,
            })
        })
        .collect();
    v.sort_by_key(|m| m.version);
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn migrations_are_numbered_uniquely_and_split() {
        let all = super::all();
        assert!(!all.is_empty());
        let mut versions: Vec<u32> = all.iter().map(|m| m.version).collect();
        versions.dedup();
        assert_eq!(versions.len(), all.len(), "duplicate migration version");
        for m in &all {
            let stmts = m.statements();
            assert!(!stmts.is_empty(), "{} has no statements", m.name);
            assert!(stmts.iter().all(|s| !s.ends_with(';')));
        }
    }
}
