//! CPU seconds from procfs, the one reader: a service's own `process_cpu_seconds_total`
//! (the router's `/metrics`, which `weft bench route` divides decisions by) and the
//! benchmarks' view of other processes and threads.

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Parse a `/proc/<pid>/stat` (or `/proc/<pid>/task/<tid>/stat`) text: the command name and
/// its user + system CPU seconds.
pub fn parse_stat(text: &str) -> Option<(String, f64)> {
    let open = text.find('(')?;
    // The command name is parenthesised and may hold spaces and parentheses: the fields
    // resume after the last `)`.
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    let mut rest = text.get(close + 1..)?.split_whitespace().skip(11);
    // Fields 14 and 15 (utime, stime), in clock ticks; `rest` starts at field 3.
    let utime: f64 = rest.next()?.parse().ok()?;
    let stime: f64 = rest.next()?.parse().ok()?;
    Some((comm, (utime + stime) / clock_ticks()))
}

/// (command name, user + system seconds) from a `/proc/.../stat` file; `None` where it
/// cannot be read.
pub fn stat_cpu(path: &str) -> Option<(String, f64)> {
    parse_stat(&std::fs::read_to_string(path).ok()?)
}

/// CPU seconds (user + system) this process has used; `None` where there is no procfs.
pub fn process_cpu_seconds() -> Option<f64> {
    stat_cpu("/proc/self/stat").map(|(_, s)| s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_name_with_spaces_and_parentheses() {
        let line = "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 300 200 0 0";
        let (comm, s) = parse_stat(line).unwrap();
        assert_eq!(comm, "a (b) c");
        assert!((s - 500.0 / clock_ticks()).abs() < 1e-9);
        assert_eq!(parse_stat("42 (x) S 1 2"), None);
    }

    #[test]
    fn own_cpu_grows_with_work() {
        let before = process_cpu_seconds().expect("procfs on Linux");
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(300) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = process_cpu_seconds().expect("procfs on Linux");
        assert!(after > before, "{before} -> {after}");
    }
}
