//! CPU accounting, the one way every benchmark measures it: `getrusage` for this process
//! or thread, `/proc/<pid>/stat` for another process (the broker, ClickHouse) and for each
//! of this process's threads.

use std::collections::HashMap;

use serde::Serialize;

/// Whose CPU `getrusage` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// This process, all its threads (librdkafka's included).
    Process,
    /// The calling thread only.
    Thread,
}

/// CPU seconds (user + system) of this process or of the calling thread; NaN if the system
/// will not say.
pub fn rusage(who: Who) -> f64 {
    let who = match who {
        Who::Process => libc::RUSAGE_SELF,
        Who::Thread => libc::RUSAGE_THREAD,
    };
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return f64::NAN;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// (comm, user + system seconds) from a `/proc/.../stat` file (the one procfs reader,
/// shared with the services' `process_cpu_seconds_total`).
pub use weft_http::cpu::stat_cpu;

/// CPU seconds of another process (all its threads), or NaN when unknown.
pub fn pid_cpu(pid: Option<u32>) -> f64 {
    pid.and_then(|p| stat_cpu(&format!("/proc/{p}/stat")))
        .map_or(f64::NAN, |(_, s)| s)
}

/// CPU seconds of each thread of this process, by tid.
pub fn thread_cpu() -> HashMap<u32, (String, f64)> {
    let mut out = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(v) = stat_cpu(&format!("/proc/self/task/{tid}/stat")) {
                out.insert(tid, v);
            }
        }
    }
    out
}

/// CPU of one group of this process's threads over a phase.
#[derive(Debug, Serialize)]
pub struct ThreadCpu {
    /// The threads' name without its numbering (`rdk:broker`).
    pub group: String,
    /// How many threads of that name ran.
    pub threads: usize,
    /// Their CPU seconds over the phase, together.
    pub cpu_s: f64,
}

/// Thread names without their numbering: `rdk:broker12` -> `rdk:broker`.
fn thread_group(name: &str) -> String {
    name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '-' || c == '#')
        .to_owned()
}

/// CPU per thread group between two [`thread_cpu`] snapshots, largest first.
pub fn thread_breakdown(
    before: &HashMap<u32, (String, f64)>,
    after: &HashMap<u32, (String, f64)>,
) -> Vec<ThreadCpu> {
    let mut groups: HashMap<String, (f64, usize)> = HashMap::new();
    for (tid, (name, cpu)) in after {
        let start = before.get(tid).map_or(0.0, |(_, c)| *c);
        let g = groups.entry(thread_group(name)).or_default();
        g.0 += cpu - start;
        g.1 += 1;
    }
    let mut v: Vec<ThreadCpu> = groups
        .into_iter()
        .map(|(group, (cpu_s, threads))| ThreadCpu {
            group,
            threads,
            cpu_s,
        })
        .filter(|t| t.cpu_s > 0.0)
        .collect();
    v.sort_by(|a, b| b.cpu_s.total_cmp(&a.cpu_s));
    v
}

/// The pid listening on a TCP port (from /proc/net/tcp{,6} and /proc/*/fd), if visible.
fn pid_by_port(port: u16) -> Option<u32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let listening = *state == "0A";
            let p = local
                .rsplit(':')
                .next()
                .and_then(|h| u16::from_str_radix(h, 16).ok());
            if listening && p == Some(port) {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for proc_dir in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = proc_dir
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(proc_dir.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| target.as_os_str() == i.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// The port of `host:port` or `http://host:port/...`.
pub fn port_of(addr: &str) -> Option<u16> {
    let s = addr.split(',').next()?.trim();
    let s = s.split("://").last()?;
    let hostport = s.split('/').next()?;
    hostport.rsplit(':').next()?.parse().ok()
}

/// A service pid: the flag, else `$WEFT_RUN_DIR/<name>.pid` (if alive), else by port.
pub fn service_pid(flag: Option<u32>, name: &str, port: Option<u16>) -> Option<u32> {
    if flag.is_some() {
        return flag;
    }
    if let Ok(dir) = std::env::var("WEFT_RUN_DIR") {
        if let Ok(text) = std::fs::read_to_string(format!("{dir}/{name}.pid")) {
            if let Ok(pid) = text.trim().parse::<u32>() {
                if std::path::Path::new(&format!("/proc/{pid}/stat")).exists() {
                    return Some(pid);
                }
            }
        }
    }
    port.and_then(pid_by_port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_thread_groups() {
        assert_eq!(port_of("127.0.0.1:39092"), Some(39092));
        assert_eq!(port_of("a:1,b:2"), Some(1));
        assert_eq!(port_of("http://127.0.0.1:38123"), Some(38123));
        assert_eq!(port_of("http://127.0.0.1:38123/"), Some(38123));
        assert_eq!(thread_group("rdk:broker12"), "rdk:broker");
        assert_eq!(thread_group("rdk:broker-1"), "rdk:broker");
        assert_eq!(thread_group("tokio-runtime-w"), "tokio-runtime-w");
    }

    #[test]
    fn own_cpu_is_readable() {
        let me = stat_cpu("/proc/self/stat").expect("own stat");
        assert!(me.1 >= 0.0);
        assert!(!thread_cpu().is_empty());
        assert!(rusage(Who::Process) >= 0.0);
    }

    #[test]
    fn thread_cpu_grows_with_work() {
        let before = rusage(Who::Thread);
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        std::hint::black_box(x);
        assert!(rusage(Who::Thread) > before, "50 ms of spinning costs CPU");
    }
}
