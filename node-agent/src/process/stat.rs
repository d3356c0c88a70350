//! `/proc/<pid>/stat` and `/proc/<pid>/cgroup`, parsed without trusting the process's name.
//!
//! The second field of `stat` is the command name in parentheses, and the process chooses it: it
//! may hold spaces and parentheses (`a) R 1 (`). The fields after it are found from the *last*
//! `)`, which the kernel always writes after the name.

use std::io;

/// What the agent needs from `/proc/<pid>/stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3: `R`, `S`, `D`, `Z` (exited, not yet reaped), `X`, …
    pub state: char,
    /// Field 22: start time in clock ticks since boot. Unchanged by `exec`, different for any
    /// later process that reuses the pid.
    pub start_time: u64,
}

impl ProcStat {
    /// An exited process whose parent has not reaped it yet: its pid cannot be reused, but it
    /// is not running.
    pub fn is_exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Why a stat line could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed /proc stat line")]
pub struct MalformedStat;

/// Parses one `/proc/<pid>/stat` line.
pub fn parse_stat(line: &str) -> Result<ProcStat, MalformedStat> {
    let close = line.rfind(')').ok_or(MalformedStat)?;
    let mut rest = line[close + 1..].split_ascii_whitespace();
    // `rest` starts at field 3 (state); field 22 is 19 further on.
    let state = rest
        .next()
        .and_then(|s| {
            let mut c = s.chars();
            c.next().filter(|_| c.next().is_none())
        })
        .ok_or(MalformedStat)?;
    let start_time = rest
        .nth(18)
        .and_then(|s| s.parse().ok())
        .ok_or(MalformedStat)?;
    Ok(ProcStat { state, start_time })
}

/// Reads `/proc/<pid>/stat`. `Ok(None)`: no such process.
pub fn read_stat(pid: u32) -> io::Result<Option<ProcStat>> {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(line) => parse_stat(&line)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(e) if is_gone(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The process's cgroup v2 path (the `0::` line of `/proc/<pid>/cgroup`, relative to the v2
/// mount). `Ok(None)`: no such process, or no v2 line.
pub fn read_cgroup_v2(pid: u32) -> io::Result<Option<String>> {
    match std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
        Ok(text) => Ok(parse_cgroup_v2(&text).map(str::to_owned)),
        Err(e) if is_gone(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The `0::<path>` line's path.
pub fn parse_cgroup_v2(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::"))
}

fn is_gone(e: &io::Error) -> bool {
    // ESRCH shows up when the process exits between open and read.
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(3)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(comm: &str, state: &str, start: u64) -> String {
        let mut fields: Vec<String> = (4..=52).map(|i| i.to_string()).collect();
        fields[22 - 4] = start.to_string();
        format!("4242 ({comm}) {state} {}\n", fields.join(" "))
    }

    #[test]
    fn start_time_is_field_22_whatever_the_name_holds() {
        for comm in [
            "Runner.Listener",
            "a b",
            "x) R 1 (y",
            "))",
            "(",
            "",
            "evil) Z 9 9 9",
        ] {
            let s = parse_stat(&line(comm, "S", 987_654)).unwrap();
            assert_eq!(
                s,
                ProcStat {
                    state: 'S',
                    start_time: 987_654
                },
                "comm {comm:?}"
            );
        }
    }

    #[test]
    fn zombies_are_exited() {
        assert!(parse_stat(&line("x", "Z", 1)).unwrap().is_exited());
        assert!(!parse_stat(&line("x", "R", 1)).unwrap().is_exited());
    }

    #[test]
    fn truncated_or_nameless_lines_are_refused() {
        assert_eq!(parse_stat("4242 (x) S 1 2 3"), Err(MalformedStat));
        assert_eq!(parse_stat("4242 x S"), Err(MalformedStat));
        assert_eq!(parse_stat(&line("x", "SS", 1)), Err(MalformedStat));
    }

    #[test]
    fn own_stat_is_readable_and_stable() {
        let me = std::process::id();
        let a = read_stat(me).unwrap().unwrap();
        let b = read_stat(me).unwrap().unwrap();
        assert_eq!(a.start_time, b.start_time);
        assert!(!a.is_exited());
    }

    #[test]
    fn the_v2_line_is_found_among_v1_lines() {
        let text = "4:memory:/a\n0::/runner-manager.slice/rm-0123456789ab\n1:cpu:/\n";
        assert_eq!(
            parse_cgroup_v2(text),
            Some("/runner-manager.slice/rm-0123456789ab")
        );
        assert_eq!(parse_cgroup_v2("4:memory:/a\n"), None);
    }
}
