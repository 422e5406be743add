//! The columns of weft's tables as the migration DDL declares them, read from the SQL text
//! itself (`CREATE TABLE` column lists and `ALTER TABLE ... ADD COLUMN`), so the code can
//! check itself against the migrations: every column of `weft_events` accounted for, the
//! cluster DDL (`deploy/clickhouse-cluster/`) column for column the same as the default
//! set, and the MATERIALIZED expressions `weft audit verify` evaluates again.
//!
//! Not a SQL parser: it understands the shapes weft's migrations use (one statement per
//! `;`-terminated line, `--` comments), and the tests that use it fail loudly on others.

use std::collections::BTreeMap;

use weft_schemas::migrations::Migration;

/// One column as declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Column name.
    pub name: String,
    /// Everything after the name (type, codec, default), whitespace normalised.
    pub definition: String,
    /// The expression after `MATERIALIZED`, when the column is computed by ClickHouse.
    pub materialized: Option<String>,
}

/// Tables by name, each with its columns in declaration order.
pub type Tables = BTreeMap<String, Vec<Column>>;

/// Collapse whitespace, and drop it next to brackets and commas, so two spellings of one
/// definition compare equal.
pub fn normalise(s: &str) -> String {
    let words = s.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::with_capacity(words.len());
    let mut chars = words.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ' ' {
            let prev = out.chars().last();
            let next = chars.peek().copied();
            if matches!(prev, Some('(' | '[' | ',')) || matches!(next, Some(')' | ']' | ',')) {
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// Split at commas outside brackets and quotes.
fn split_top(s: &str) -> Vec<String> {
    let (mut depth, mut quote, mut cur, mut out) = (0i32, false, String::new(), Vec::new());
    for c in s.chars() {
        match c {
            '\'' => quote = !quote,
            '(' | '[' if !quote => depth += 1,
            ')' | ']' if !quote => depth -= 1,
            ',' if !quote && depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out
}

/// The text between the first `(` at or after `from` and its matching `)`.
fn bracketed(s: &str, from: usize) -> Option<&str> {
    let open = from + s[from..].find('(')?;
    let mut depth = 0;
    for (i, c) in s[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&s[open + 1..open + i]);
                }
            }
            _ => {}
        }
    }
    None
}

fn column(text: &str) -> Option<Column> {
    let text = text.trim();
    let (name, rest) = text.split_once(char::is_whitespace)?;
    let definition = normalise(rest);
    let materialized = definition
        .split_once("MATERIALIZED ")
        .map(|(_, e)| e.to_owned());
    Some(Column {
        name: name.trim_matches('`').to_owned(),
        definition,
        materialized,
    })
}

/// The word after `keyword` (skipping `IF NOT EXISTS` / `IF EXISTS`), unquoted.
fn name_after<'a>(words: &[&'a str], keyword: &str) -> Option<(&'a str, usize)> {
    let mut i = words.iter().position(|w| *w == keyword)? + 1;
    while matches!(words.get(i), Some(&("IF" | "NOT" | "EXISTS"))) {
        i += 1;
    }
    Some((words.get(i)?.trim_matches('`').split('(').next()?, i))
}

/// Apply one statement to `tables`: a `CREATE TABLE` adds its columns (`AS other` copies
/// the other's), an `ALTER TABLE ... ADD COLUMN` appends; other statements are ignored.
pub fn apply(tables: &mut Tables, stmt: &str) {
    let words: Vec<&str> = stmt.split_whitespace().collect();
    match words.first().copied() {
        Some("CREATE") if words.get(1) == Some(&"TABLE") => {
            let Some((name, i)) = name_after(&words, "TABLE") else {
                return;
            };
            // `CREATE TABLE x ON CLUSTER '{c}' AS y ENGINE = ...`
            if let Some(j) = words[i..].iter().position(|w| *w == "AS") {
                if words[i..i + j].iter().all(|w| !w.contains('(')) {
                    let from = words[i + j + 1];
                    let cols = tables.get(from).cloned().unwrap_or_default();
                    tables.insert(name.to_owned(), cols);
                    return;
                }
            }
            let start = stmt.find(name).unwrap_or(0);
            let cols = bracketed(stmt, start)
                .map(split_top)
                .unwrap_or_default()
                .iter()
                .filter(|c| {
                    let first = c.split_whitespace().next().unwrap_or("");
                    !["INDEX", "PROJECTION", "CONSTRAINT"].contains(&first)
                })
                .filter_map(|c| column(c))
                .collect();
            tables.insert(name.to_owned(), cols);
        }
        Some("ALTER") if words.get(1) == Some(&"TABLE") => {
            let Some((name, _)) = name_after(&words, "TABLE") else {
                return;
            };
            let Some(at) = stmt
                .find(" ADD COLUMN ")
                .or_else(|| stmt.find("\nADD COLUMN "))
            else {
                return;
            };
            let actions = &stmt[at..];
            for action in split_top(actions) {
                let a = action.trim();
                let Some(rest) = a.strip_prefix("ADD COLUMN ") else {
                    continue;
                };
                let rest = rest.trim_start();
                let rest = rest.strip_prefix("IF NOT EXISTS ").unwrap_or(rest);
                if let Some(c) = column(rest) {
                    let cols = tables.entry(name.to_owned()).or_default();
                    cols.retain(|old| old.name != c.name);
                    cols.push(c);
                }
            }
        }
        _ => {}
    }
}

/// The tables the given statements create, in order, with their columns.
pub fn tables<I: IntoIterator<Item = String>>(statements: I) -> Tables {
    let mut t = Tables::new();
    for stmt in statements {
        apply(&mut t, &stmt);
    }
    t
}

/// The MATERIALIZED columns of `table` in weft's own migrations, as (name, expression).
pub fn materialized(table: &str) -> Vec<(String, String)> {
    tables(
        weft_schemas::migrations::all()
            .iter()
            .flat_map(Migration::statements),
    )
    .remove(table)
    .unwrap_or_default()
    .into_iter()
    .filter_map(|c| c.materialized.map(|e| (c.name, e)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_create_alter_and_as() {
        let mut t = Tables::new();
        apply(
            &mut t,
            "CREATE TABLE IF NOT EXISTS a_local ON CLUSTER '{cluster}'\n(\n    x  LowCardinality(String),\n    y Array(Tuple(String, String)) CODEC(ZSTD(3)),\n    INDEX i x TYPE bloom_filter(0.01) GRANULARITY 1,\n    PROJECTION p (SELECT x, max(y) GROUP BY x)\n)\nENGINE = MergeTree ORDER BY (x, y)",
        );
        apply(
            &mut t,
            "CREATE TABLE IF NOT EXISTS a ON CLUSTER '{cluster}'\nAS a_local\nENGINE = Distributed('{cluster}', currentDatabase(), a_local, rand())",
        );
        apply(
            &mut t,
            "ALTER TABLE a\n    ADD COLUMN IF NOT EXISTS z UInt8\n        MATERIALIZED if(x = 'a,b', 1, 0),\n    ADD COLUMN IF NOT EXISTS w String",
        );
        assert_eq!(
            t["a_local"]
                .iter()
                .map(|c| (c.name.as_str(), c.definition.as_str()))
                .collect::<Vec<_>>(),
            [
                ("x", "LowCardinality(String)"),
                ("y", "Array(Tuple(String,String)) CODEC(ZSTD(3))")
            ]
        );
        let a: Vec<&str> = t["a"].iter().map(|c| c.name.as_str()).collect();
        assert_eq!(a, ["x", "y", "z", "w"]);
        assert_eq!(t["a"][2].materialized.as_deref(), Some("if(x = 'a,b',1,0)"));
        assert_eq!(t["a"][3].materialized, None);
    }

    #[test]
    fn the_token_columns_are_materialized() {
        let m: Vec<String> = materialized("weft_events")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(m, ["token_scope", "token_expires_at", "token_single_use"]);
    }
}
