//! Which hosts the product talks to (issue 13, finding 8): admin lists of host names, and the
//! check of a URL against them. Pure; shared by the operator (GitHub hosts, package URLs) and
//! the node agent (package downloads), so both sides read a list the same way.
//!
//! An entry is `host` (any port) or `host:port` (that port only), compared case-insensitively;
//! IPv6 literals are written in brackets (`[::1]`).

use std::fmt;

/// A comma-separated admin list of hosts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostList(Vec<String>);

/// Why a list entry is not a host.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a host name or host:port (no scheme, path or credentials)")]
pub struct BadHostEntry(pub String);

impl HostList {
    /// `a.example,b.example:8443`; blanks are ignored.
    pub fn parse(s: &str) -> Result<Self, BadHostEntry> {
        s.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| {
                let lower = e.to_ascii_lowercase();
                let ok = !lower.contains(['/', '@', '?', '#', ' '])
                    && split_authority(&lower).is_some_and(|(h, _)| !h.is_empty());
                ok.then_some(lower)
                    .ok_or_else(|| BadHostEntry(e.to_owned()))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    pub fn entries(&self) -> &[String] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `authority` (`host` or `host:port`, as in a URL) is on the list.
    pub fn contains(&self, authority: &str) -> bool {
        let lower = authority.to_ascii_lowercase();
        let Some((host, port)) = split_authority(&lower) else {
            return false;
        };
        self.0.iter().any(|entry| match split_authority(entry) {
            Some((h, None)) => h == host,
            Some((h, Some(p))) => h == host && port == Some(p),
            None => false,
        })
    }
}

impl fmt::Display for HostList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

/// `host[:port]` split; `[v6]:port` keeps the brackets on the host. `None` when the port is
/// not a number.
fn split_authority(authority: &str) -> Option<(&str, Option<u16>)> {
    if authority.starts_with('[') {
        let end = authority.find(']')?;
        let (host, rest) = authority.split_at(end + 1);
        return match rest.strip_prefix(':') {
            None if rest.is_empty() => Some((host, None)),
            Some(p) => Some((host, Some(p.parse().ok()?))),
            None => None,
        };
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h, Some(p.parse().ok()?))),
        None => Some((authority, None)),
    }
}

/// A URL's scheme and authority (`host[:port]`, lower case, credentials refused).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UrlHost {
    pub https: bool,
    pub authority: String,
}

/// Why a URL may not be fetched.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlRefused {
    #[error("is not an http(s) URL with a host")]
    Unparsable,
    #[error(
        "uses http, which is refused unless the admin allows http for its host (--allow-http-hosts)"
    )]
    PlainHttp,
}

/// The scheme and authority of `url`. Credentials before the host are refused (a URL carrying
/// them is never fetched).
pub fn url_host(url: &str) -> Result<UrlHost, UrlRefused> {
    let lower = url.trim().to_ascii_lowercase();
    let (https, rest) = if let Some(r) = lower.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = lower.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(UrlRefused::Unparsable);
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() || authority.contains('@') || split_authority(authority).is_none() {
        return Err(UrlRefused::Unparsable);
    }
    Ok(UrlHost {
        https,
        authority: authority.to_owned(),
    })
}

/// `url` may be fetched: https, or http to a host on `http_hosts`.
pub fn check_scheme(url: &str, http_hosts: &HostList) -> Result<UrlHost, UrlRefused> {
    let h = url_host(url)?;
    if h.https || http_hosts.contains(&h.authority) {
        Ok(h)
    } else {
        Err(UrlRefused::PlainHttp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_match_any_port_or_their_own() {
        let l = HostList::parse(" GHES.example.com , mirror.example:8443,[::1]").unwrap();
        assert!(l.contains("ghes.example.com"));
        assert!(l.contains("ghes.example.com:443"));
        assert!(l.contains("Mirror.Example:8443"));
        assert!(!l.contains("mirror.example:443"));
        assert!(!l.contains("mirror.example"));
        assert!(l.contains("[::1]:9000"));
        assert!(!l.contains("evil.example.com"));
        assert!(!l.contains("ghes.example.com.evil.example"));
        assert!(HostList::parse("").unwrap().is_empty());
        for bad in ["https://x", "a/b", "u@h", "h:port", ":80"] {
            assert!(HostList::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn http_only_for_listed_hosts() {
        let none = HostList::default();
        let local = HostList::parse("127.0.0.1").unwrap();
        assert!(check_scheme("https://github.com/a", &none).is_ok());
        assert_eq!(
            check_scheme("http://127.0.0.1:8080/p", &none),
            Err(UrlRefused::PlainHttp)
        );
        let h = check_scheme("http://127.0.0.1:8080/p", &local).unwrap();
        assert_eq!(h.authority, "127.0.0.1:8080");
        assert_eq!(
            check_scheme("http://localhost/p", &local),
            Err(UrlRefused::PlainHttp)
        );
        assert_eq!(
            check_scheme("ftp://127.0.0.1/p", &local),
            Err(UrlRefused::Unparsable)
        );
        assert_eq!(
            check_scheme("https://u:p@github.com/a", &none),
            Err(UrlRefused::Unparsable)
        );
    }
}
