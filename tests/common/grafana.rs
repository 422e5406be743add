//! What Grafana and the official ClickHouse plugin (`grafana-clickhouse-datasource`) do to a
//! panel's SQL before ClickHouse sees it, so the dashboard tests run exactly that text.
//!
//! 1. Grafana interpolates template variables in the browser. The dashboards only use
//!    `${name:sqlstring}` (each `'` doubled, the value wrapped in `'...'`).
//! 2. The plugin's backend expands its macros (`pkg/macros/macros.go`, found by the
//!    regular expression `\$__name\b` with an optional balanced, comma-separated argument
//!    list whose arguments are trimmed):
//!    - `$__timeFilter(c)` → `c >= toDateTime(FROM_S) AND c <= toDateTime(TO_S)`
//!    - `$__timeFilter_ms(c)` → `c >= fromUnixTimestamp64Milli(FROM_MS) AND c <= fromUnixTimestamp64Milli(TO_MS)`
//!    - `$__dateFilter(c)` → `c >= toDate('YYYY-MM-DD') AND c <= toDate('YYYY-MM-DD')`
//!    - `$__fromTime` / `$__toTime` → `toDateTime(S)`; `_ms` → `fromUnixTimestamp64Milli(MS)`
//!    - `$__timeInterval(c)` → `toStartOfInterval(toDateTime(c), INTERVAL N second)`, N =
//!      max(interval seconds, 1), truncated to an integer
//!    - `$__timeInterval_ms(c)` → `toStartOfInterval(toDateTime64(c, 3), INTERVAL N millisecond)`
//!    - `$__interval_s` → N
//!
//!    Anything else that looks like a macro is an error here, so a dashboard cannot use a
//!    macro this expander does not know.

use std::collections::BTreeMap;

/// The time range and interval Grafana would send with the query.
#[derive(Debug, Clone, Copy)]
pub struct TimeRange {
    /// Range start, Unix milliseconds.
    pub from_ms: i64,
    /// Range end, Unix milliseconds.
    pub to_ms: i64,
    /// The panel's interval (`$__interval`), milliseconds.
    pub interval_ms: i64,
}

/// Grafana's `sqlstring` format: `'` doubled, the value single-quoted.
pub fn sqlstring(v: &str) -> String {
    format!("'{}'", v.replace('\'', "''"))
}

/// Replace `${name:sqlstring}` for every variable; panics on any other variable syntax left.
pub fn interpolate(sql: &str, vars: &BTreeMap<&str, String>) -> String {
    let mut out = sql.to_owned();
    for (name, value) in vars {
        out = out.replace(&format!("${{{name}:sqlstring}}"), &sqlstring(value));
    }
    assert!(
        !out.contains("${"),
        "unresolved template variable in:\n{out}"
    );
    out
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The balanced argument list at the start of `rest`: (trimmed args, bytes consumed).
fn parse_args(rest: &str) -> (Vec<String>, usize) {
    if !rest.starts_with('(') {
        return (Vec::new(), 0);
    }
    let mut args = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for (i, c) in rest.char_indices() {
        match c {
            '(' => {
                depth += 1;
                if depth == 1 {
                    continue;
                }
            }
            ')' => {
                depth -= 1;
                if depth == 0 {
                    args.push(cur.trim().to_owned());
                    return (args, i + 1);
                }
            }
            ',' if depth == 1 => {
                args.push(cur.trim().to_owned());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    panic!("macro arguments not closed: {rest}");
}

fn one(name: &str, args: &[String]) -> String {
    assert_eq!(args.len(), 1, "$__{name} takes exactly one argument");
    args[0].clone()
}

/// `YYYY-MM-DD` (UTC) of a Unix time in milliseconds (Howard Hinnant's civil_from_days).
fn date(ms: i64) -> String {
    let z = ms.div_euclid(86_400_000) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Expand every plugin macro the way `grafana-clickhouse-datasource` does.
pub fn expand_macros(sql: &str, r: TimeRange) -> String {
    let (from_s, to_s) = (r.from_ms.div_euclid(1000), r.to_ms.div_euclid(1000));
    let secs = (r.interval_ms / 1000).max(1);
    let ms = r.interval_ms.max(1);
    type Expand<'a> = Box<dyn Fn(&[String]) -> String + 'a>;
    let macros: Vec<(&str, Expand)> = vec![
        (
            "fromTime_ms",
            Box::new(|_: &[String]| format!("fromUnixTimestamp64Milli({})", r.from_ms)),
        ),
        (
            "toTime_ms",
            Box::new(|_: &[String]| format!("fromUnixTimestamp64Milli({})", r.to_ms)),
        ),
        (
            "fromTime",
            Box::new(move |_: &[String]| format!("toDateTime({from_s})")),
        ),
        (
            "toTime",
            Box::new(move |_: &[String]| format!("toDateTime({to_s})")),
        ),
        (
            "timeFilter_ms",
            Box::new(|a: &[String]| {
                let c = one("timeFilter_ms", a);
                format!(
                    "{c} >= fromUnixTimestamp64Milli({}) AND {c} <= fromUnixTimestamp64Milli({})",
                    r.from_ms, r.to_ms
                )
            }),
        ),
        (
            "timeFilter",
            Box::new(move |a: &[String]| {
                let c = one("timeFilter", a);
                format!("{c} >= toDateTime({from_s}) AND {c} <= toDateTime({to_s})")
            }),
        ),
        (
            "dateFilter",
            Box::new(|a: &[String]| {
                let c = one("dateFilter", a);
                format!(
                    "{c} >= toDate('{}') AND {c} <= toDate('{}')",
                    date(r.from_ms),
                    date(r.to_ms)
                )
            }),
        ),
        (
            "timeInterval_ms",
            Box::new(move |a: &[String]| {
                let c = one("timeInterval_ms", a);
                format!("toStartOfInterval(toDateTime64({c}, 3), INTERVAL {ms} millisecond)")
            }),
        ),
        (
            "timeInterval",
            Box::new(move |a: &[String]| {
                let c = one("timeInterval", a);
                format!("toStartOfInterval(toDateTime({c}), INTERVAL {secs} second)")
            }),
        ),
        ("interval_s", Box::new(move |_: &[String]| secs.to_string())),
    ];
    let mut out = sql.to_owned();
    for (name, f) in &macros {
        let pat = format!("$__{name}");
        let mut from = 0;
        while let Some(pos) = out[from..].find(&pat).map(|p| p + from) {
            let end = pos + pat.len();
            if out.as_bytes().get(end).copied().is_some_and(is_word) {
                from = end; // a longer name (`$__timeFilter_ms` when looking for `timeFilter`)
                continue;
            }
            let (args, used) = parse_args(&out[end..]);
            let text = f(&args);
            out.replace_range(pos..end + used, &text);
            from = pos + text.len();
        }
    }
    assert!(!out.contains("$__"), "unknown macro left in:\n{out}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: TimeRange = TimeRange {
        from_ms: 1_700_000_000_123,
        to_ms: 1_700_003_600_456,
        interval_ms: 30_500,
    };

    #[test]
    fn expands_like_the_plugin() {
        assert_eq!(
            expand_macros("WHERE $__timeFilter( ts ) AND $__timeFilter_ms(x)", R),
            "WHERE ts >= toDateTime(1700000000) AND ts <= toDateTime(1700003600) AND \
             x >= fromUnixTimestamp64Milli(1700000000123) AND x <= fromUnixTimestamp64Milli(1700003600456)"
        );
        assert_eq!(
            expand_macros("$__timeInterval(ts) $__interval_s $__timeInterval_ms(t)", R),
            "toStartOfInterval(toDateTime(ts), INTERVAL 30 second) 30 \
             toStartOfInterval(toDateTime64(t, 3), INTERVAL 30500 millisecond)"
        );
        assert_eq!(
            expand_macros("$__fromTime $__toTime_ms $__dateFilter(d)", R),
            "toDateTime(1700000000) fromUnixTimestamp64Milli(1700003600456) \
             d >= toDate('2023-11-14') AND d <= toDate('2023-11-14')"
        );
        assert_eq!(
            expand_macros("$__timeInterval(toDateTime(a, 'UTC'))", R),
            "toStartOfInterval(toDateTime(toDateTime(a, 'UTC')), INTERVAL 30 second)"
        );
    }

    #[test]
    fn interpolates_sqlstring() {
        let vars = BTreeMap::from([("tenant", "o'brien".to_owned())]);
        assert_eq!(
            interpolate("tenant = ${tenant:sqlstring}", &vars),
            "tenant = 'o''brien'"
        );
    }
}
