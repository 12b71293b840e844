//! The allow-list: `allowed_outbound_hosts` entries (`scheme://host[:port]`, a `*.` subdomain
//! wildcard, IP literals), checked when the grant is made, and the matching of a request's
//! target against them. Also the address check: which resolved addresses a request may reach
//! without being listed (the public unicast internet). Pure functions, tested here.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::uri::Scheme;
use wasmtime_wasi_http::Error as HttpError;

/// The scheme of an allow-list entry: an entry grants one scheme, so listing
/// `https://api.example.com` never lets a plugin talk to it in clear text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OriginScheme {
    /// `http://`, default port 80.
    Http,
    /// `https://`, default port 443.
    Https,
}

impl OriginScheme {
    pub(crate) fn default_port(self) -> u16 {
        match self {
            OriginScheme::Http => 80,
            OriginScheme::Https => 443,
        }
    }
}

impl fmt::Display for OriginScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OriginScheme::Http => "http",
            OriginScheme::Https => "https",
        })
    }
}

/// The host part of an allow-list entry; kept apart from names so that an IP literal can
/// also lift the address check for exactly that address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedHost {
    /// One DNS name (lower case), matched exactly.
    Name(String),
    /// `*.example.com`: any name with at least one more label in front of the suffix
    /// (`a.example.com`, `a.b.example.com`), never the suffix itself.
    Subdomains(String),
    /// An IP literal; requests to it, and names resolving to it on the same scheme and port,
    /// pass the address check even when it is loopback or private.
    Ip(IpAddr),
}

/// One checked `allowed_outbound_hosts` entry: what a plugin may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedOrigin {
    /// The scheme the entry grants.
    pub scheme: OriginScheme,
    /// The host (name, subdomain wildcard or IP literal).
    pub host: AllowedHost,
    /// The port (the scheme's default when the entry names none).
    pub port: u16,
}

impl AllowedOrigin {
    /// Whether a request to `target` is within this entry.
    fn permits(&self, target: &Target) -> bool {
        if self.scheme != target.scheme || self.port != target.port {
            return false;
        }
        match (&self.host, &target.host) {
            (AllowedHost::Name(name), TargetHost::Name(host)) => name == host,
            (AllowedHost::Subdomains(suffix), TargetHost::Name(host)) => host
                .strip_suffix(suffix.as_str())
                .and_then(|front| front.strip_suffix('.'))
                .is_some_and(|front| !front.is_empty() && !front.ends_with('.')),
            (AllowedHost::Ip(listed), TargetHost::Ip(ip)) => {
                listed.to_canonical() == ip.to_canonical()
            }
            _ => false,
        }
    }
}

impl fmt::Display for AllowedOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.scheme)?;
        match &self.host {
            AllowedHost::Name(name) => f.write_str(name)?,
            AllowedHost::Subdomains(suffix) => write!(f, "*.{suffix}")?,
            AllowedHost::Ip(IpAddr::V4(ip)) => write!(f, "{ip}")?,
            AllowedHost::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]")?,
        }
        write!(f, ":{}", self.port)
    }
}

/// Why an `allowed_outbound_hosts` entry was refused; the manifest shows it at the entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("allowed_outbound_hosts entry {entry:?}: {problem}")]
pub struct OriginError {
    /// The entry as written.
    pub entry: String,
    /// What is wrong with it.
    pub problem: OriginProblem,
}

/// What is wrong with an allow-list entry, one case per rule so tests (and users) can tell.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginProblem {
    /// No `scheme://` in front.
    #[error("expected scheme://host[:port], e.g. https://api.example.com")]
    MissingScheme,
    /// A scheme other than http or https.
    #[error("scheme {0:?} is not supported (http or https)")]
    UnsupportedScheme(String),
    /// `user@host`: credentials belong in secrets, not in the grant.
    #[error("user information (user@host) is not allowed")]
    UserInfo,
    /// A path, query or fragment: the grant is per origin.
    #[error("a path, query or fragment is not allowed (the grant is scheme://host[:port])")]
    Path,
    /// Nothing between `://` and the port.
    #[error("no host")]
    MissingHost,
    /// A port that is not 1..=65535.
    #[error("port {0:?} is not a number from 1 to 65535")]
    BadPort(String),
    /// An unbracketed or malformed IPv6 literal.
    #[error("an IPv6 address must be written in brackets, e.g. http://[::1]:8080")]
    BadIpv6,
    /// A `*` anywhere but a leading `*.` label, or a wildcard over a top-level domain.
    #[error(
        "the only wildcard is a leading \"*.\" over a domain of two labels or more (https://*.example.com)"
    )]
    BadWildcard,
    /// Not a DNS name.
    #[error("{0:?} is not a valid host name")]
    BadHost(String),
    /// A name whose last label is numeric (`127.1`): resolvers read those as IPv4 addresses.
    #[error("{0:?} looks like an IPv4 address but is not one; write the address in full")]
    NumericHost(String),
}

/// Checks one `allowed_outbound_hosts` entry: `scheme://host[:port]`, scheme http or https,
/// host a DNS name, an IP literal (IPv6 in brackets) or `*.domain`; no path, no user
/// information, no other wildcard. Exposed so the manifest can point at the bad entry.
pub fn parse_allowed_origin(entry: &str) -> Result<AllowedOrigin, OriginError> {
    let fail = |problem| OriginError {
        entry: entry.to_owned(),
        problem,
    };
    let (scheme, rest) = entry
        .split_once("://")
        .ok_or_else(|| fail(OriginProblem::MissingScheme))?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" => OriginScheme::Http,
        "https" => OriginScheme::Https,
        _ => return Err(fail(OriginProblem::UnsupportedScheme(scheme.to_owned()))),
    };
    // A lone trailing slash is the empty path, which people write out of habit.
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('@') {
        return Err(fail(OriginProblem::UserInfo));
    }
    if rest.contains(['/', '?', '#']) {
        return Err(fail(OriginProblem::Path));
    }
    if rest.is_empty() {
        return Err(fail(OriginProblem::MissingHost));
    }
    let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
        let (literal, tail) = bracketed
            .split_once(']')
            .ok_or_else(|| fail(OriginProblem::BadIpv6))?;
        let ip: Ipv6Addr = literal.parse().map_err(|_| fail(OriginProblem::BadIpv6))?;
        let port = match tail {
            "" => None,
            tail => Some(
                tail.strip_prefix(':')
                    .ok_or_else(|| fail(OriginProblem::BadPort(tail.to_owned())))?,
            ),
        };
        (AllowedHost::Ip(IpAddr::V6(ip)), port)
    } else {
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        };
        if host.contains(':') {
            return Err(fail(OriginProblem::BadIpv6));
        }
        (parse_host(host).map_err(fail)?, port)
    };
    let port = match port {
        None => scheme.default_port(),
        Some(text) => parse_port(text).ok_or_else(|| fail(OriginProblem::BadPort(text.into())))?,
    };
    Ok(AllowedOrigin { scheme, host, port })
}

fn parse_port(text: &str) -> Option<u16> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u16>().ok().filter(|p| *p != 0)
}

fn parse_host(host: &str) -> Result<AllowedHost, OriginProblem> {
    if host.is_empty() {
        return Err(OriginProblem::MissingHost);
    }
    if host.contains('*') {
        let suffix = host.strip_prefix("*.").ok_or(OriginProblem::BadWildcard)?;
        if suffix.contains('*') || !suffix.contains('.') {
            return Err(OriginProblem::BadWildcard);
        }
        return dns_name(suffix).map(AllowedHost::Subdomains);
    }
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Ok(AllowedHost::Ip(IpAddr::V4(ip)));
    }
    dns_name(host).map(AllowedHost::Name)
}

/// A DNS name in lower case: labels of letters, digits and inner hyphens, 63 bytes at most,
/// 253 in all, and a last label that is not a number.
fn dns_name(name: &str) -> Result<String, OriginProblem> {
    let bad = || OriginProblem::BadHost(name.to_owned());
    if name.len() > 253 {
        return Err(bad());
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(bad());
        }
    }
    if name
        .rsplit('.')
        .next()
        .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(OriginProblem::NumericHost(name.to_owned()));
    }
    Ok(name.to_ascii_lowercase())
}

/// Whether an address may be reached without being listed: the public unicast internet.
///
/// Written by hand because `IpAddr::is_global` is still unstable and no maintained crate
/// offers the check with IPv4-mapped and embedded addresses handled the same way.
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT), RFC 6598
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (18..20).contains(&b)) // benchmarking, RFC 2544
        || a >= 240) // reserved
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) carry an IPv4 address a gateway will reach.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        return is_public_v4(Ipv4Addr::new(
            (s[6] >> 8) as u8,
            s[6] as u8,
            (s[7] >> 8) as u8,
            s[7] as u8,
        ));
    }
    if s[0] == 0x2002 {
        return is_public_v4(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || s[0..6] == [0, 0, 0, 0, 0, 0] // IPv4-compatible (deprecated) and the rest of ::/96
        || (s[0] & 0xfe00) == 0xfc00 // unique local, fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local, fe80::/10
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated), fec0::/10
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation, 2001:db8::/32
        || (s[0] == 0x2001 && s[1] == 0) // Teredo, 2001::/32
        || s[0] == 0x0100 && s[1..4] == [0, 0, 0]) // discard-only, 100::/64
}

/// A checked `allowed_outbound_hosts`: the origins a grant lets a plugin reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AllowList {
    origins: Vec<AllowedOrigin>,
}

impl AllowList {
    /// Checks every entry ([`parse_allowed_origin`]); the first bad one is the error.
    pub(crate) fn parse(entries: &[String]) -> Result<Self, OriginError> {
        let origins = entries
            .iter()
            .map(|entry| parse_allowed_origin(entry))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { origins })
    }

    /// The checked entries, in the manifest's order.
    pub(crate) fn origins(&self) -> &[AllowedOrigin] {
        &self.origins
    }

    /// Whether a request to `target` is within some entry.
    pub(crate) fn permits(&self, target: &Target) -> bool {
        self.origins.iter().any(|o| o.permits(target))
    }

    /// Whether `ip` is listed as an IP literal for this scheme and port (which lifts the
    /// address check for it).
    pub(crate) fn ip_listed(&self, scheme: OriginScheme, ip: IpAddr, port: u16) -> bool {
        let ip = ip.to_canonical();
        self.origins.iter().any(|o| {
            o.scheme == scheme
                && o.port == port
                && matches!(o.host, AllowedHost::Ip(listed) if listed.to_canonical() == ip)
        })
    }
}

/// Where a request goes, read from its URI.
pub(crate) struct Target {
    /// Its scheme.
    pub(crate) scheme: OriginScheme,
    /// Its host.
    pub(crate) host: TargetHost,
    /// Its port (the scheme's default when the URI names none).
    pub(crate) port: u16,
}

/// The host of a request: a name (lower case) or an IP literal.
pub(crate) enum TargetHost {
    /// A DNS name, lower-cased.
    Name(String),
    /// An IP literal.
    Ip(IpAddr),
}

impl Target {
    /// The target of `uri`; a URI without an http(s) scheme or a host is refused with the
    /// code the guest sees.
    pub(crate) fn of(uri: &http::Uri) -> Result<Self, HttpError> {
        let scheme = match uri.scheme() {
            Some(s) if *s == Scheme::HTTPS => OriginScheme::Https,
            Some(s) if *s == Scheme::HTTP => OriginScheme::Http,
            _ => return Err(HttpError::HttpProtocolError),
        };
        let host = uri.host().ok_or(HttpError::HttpRequestUriInvalid)?;
        let host = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            TargetHost::Ip(IpAddr::V6(
                v6.parse().map_err(|_| HttpError::HttpRequestUriInvalid)?,
            ))
        } else if let Ok(v4) = host.parse::<Ipv4Addr>() {
            TargetHost::Ip(IpAddr::V4(v4))
        } else if host.is_empty() {
            return Err(HttpError::HttpRequestUriInvalid);
        } else {
            TargetHost::Name(host.to_ascii_lowercase())
        };
        let port = uri.port_u16().unwrap_or(scheme.default_port());
        Ok(Target { scheme, host, port })
    }
}

/// `scheme://host:port`, what logs show of a request (never its path or query, which may
/// carry tokens).
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            TargetHost::Name(name) => write!(f, "{}://{name}:{}", self.scheme, self.port),
            TargetHost::Ip(IpAddr::V4(ip)) => write!(f, "{}://{ip}:{}", self.scheme, self.port),
            TargetHost::Ip(IpAddr::V6(ip)) => write!(f, "{}://[{ip}]:{}", self.scheme, self.port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(entry: &str) -> AllowedOrigin {
        parse_allowed_origin(entry).unwrap_or_else(|e| panic!("{entry}: {e}"))
    }

    fn problem(entry: &str) -> OriginProblem {
        match parse_allowed_origin(entry) {
            Ok(o) => panic!("{entry} was accepted as {o:?}"),
            Err(e) => {
                assert_eq!(e.entry, entry);
                assert!(e.to_string().contains(entry), "{e}");
                e.problem
            }
        }
    }

    fn target(url: &str) -> Target {
        Target::of(&url.parse().expect("uri")).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn permits(entry: &str, url: &str) -> bool {
        origin(entry).permits(&target(url))
    }

    #[test]
    fn allow_list_entries_take_scheme_host_and_default_or_given_port() {
        assert_eq!(
            origin("https://API.Example.com"),
            AllowedOrigin {
                scheme: OriginScheme::Https,
                host: AllowedHost::Name("api.example.com".into()),
                port: 443
            }
        );
        assert_eq!(origin("http://example.com").port, 80);
        assert_eq!(origin("http://example.com/").port, 80);
        assert_eq!(origin("HTTP://example.com:8080").port, 8080);
        assert_eq!(
            origin("http://127.0.0.1:8080").host,
            AllowedHost::Ip("127.0.0.1".parse().expect("ip"))
        );
        assert_eq!(
            origin("https://[::1]:8443"),
            AllowedOrigin {
                scheme: OriginScheme::Https,
                host: AllowedHost::Ip("::1".parse().expect("ip")),
                port: 8443
            }
        );
        assert_eq!(
            origin("https://*.example.com").host,
            AllowedHost::Subdomains("example.com".into())
        );
        assert_eq!(
            origin("https://*.example.com:8443").to_string(),
            "https://*.example.com:8443"
        );
    }

    #[test]
    fn malformed_allow_list_entries_are_refused_naming_the_entry_and_the_rule() {
        assert_eq!(problem("example.com"), OriginProblem::MissingScheme);
        assert_eq!(
            problem("ftp://example.com"),
            OriginProblem::UnsupportedScheme("ftp".into())
        );
        assert_eq!(
            problem("https://user:pw@example.com"),
            OriginProblem::UserInfo
        );
        assert_eq!(problem("https://example.com/api"), OriginProblem::Path);
        assert_eq!(problem("https://example.com?x=1"), OriginProblem::Path);
        assert_eq!(problem("https://"), OriginProblem::MissingHost);
        assert_eq!(problem("https://:443"), OriginProblem::MissingHost);
        assert_eq!(
            problem("https://example.com:0"),
            OriginProblem::BadPort("0".into())
        );
        assert_eq!(
            problem("https://example.com:65536"),
            OriginProblem::BadPort("65536".into())
        );
        assert_eq!(
            problem("https://example.com:+80"),
            OriginProblem::BadPort("+80".into())
        );
        assert_eq!(problem("http://::1"), OriginProblem::BadIpv6);
        assert_eq!(problem("http://[::1"), OriginProblem::BadIpv6);
        assert_eq!(problem("http://[nope]"), OriginProblem::BadIpv6);
        assert_eq!(problem("https://*"), OriginProblem::BadWildcard);
        assert_eq!(problem("https://*.com"), OriginProblem::BadWildcard);
        assert_eq!(
            problem("https://a.*.example.com"),
            OriginProblem::BadWildcard
        );
        assert_eq!(
            problem("https://api*.example.com"),
            OriginProblem::BadWildcard
        );
        assert_eq!(
            problem("https://*.*.example.com"),
            OriginProblem::BadWildcard
        );
        assert_eq!(
            problem("https://exa_mple.com"),
            OriginProblem::BadHost("exa_mple.com".into())
        );
        assert_eq!(
            problem("https://-a.example.com"),
            OriginProblem::BadHost("-a.example.com".into())
        );
        assert_eq!(
            problem("https://a..example.com"),
            OriginProblem::BadHost("a..example.com".into())
        );
        assert_eq!(
            problem("http://127.1"),
            OriginProblem::NumericHost("127.1".into())
        );
    }

    #[test]
    fn entries_match_scheme_host_and_port_exactly() {
        assert!(permits(
            "https://api.example.com",
            "https://api.example.com/x?y=1"
        ));
        assert!(permits(
            "https://api.example.com",
            "https://API.example.COM:443/"
        ));
        assert!(!permits(
            "https://api.example.com",
            "http://api.example.com/"
        ));
        assert!(!permits(
            "https://api.example.com",
            "https://api.example.com:8443/"
        ));
        assert!(!permits("https://api.example.com", "https://example.com/"));
        assert!(!permits(
            "https://api.example.com",
            "https://api.example.com.evil.org/"
        ));
        assert!(permits("http://127.0.0.1:8080", "http://127.0.0.1:8080/"));
        assert!(!permits("http://127.0.0.1:8080", "http://127.0.0.1:8081/"));
        assert!(!permits("http://127.0.0.1:8080", "http://localhost:8080/"));
        assert!(!permits("http://localhost:8080", "http://127.0.0.1:8080/"));
        assert!(permits("http://[::1]:8080", "http://[::1]:8080/"));
    }

    #[test]
    fn a_subdomain_wildcard_matches_subdomains_at_any_depth_but_not_the_domain() {
        assert!(permits("https://*.example.com", "https://a.example.com/"));
        assert!(permits("https://*.example.com", "https://a.b.example.com/"));
        assert!(!permits("https://*.example.com", "https://example.com/"));
        assert!(!permits("https://*.example.com", "https://aexample.com/"));
        assert!(!permits(
            "https://*.example.com",
            "https://a.example.com.evil.org/"
        ));
        assert!(!permits("https://*.example.com", "http://a.example.com/"));
        assert!(!permits("https://*.example.com", "https://1.2.3.4/"));
    }

    #[test]
    fn only_public_unicast_addresses_pass_the_address_check_unlisted() {
        for public in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700::1111",
            "64:ff9b::808:808",
        ] {
            assert!(is_public(public.parse().expect("ip")), "{public}");
        }
        for private in [
            "127.0.0.1",
            "127.8.9.10",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "192.0.2.1",
            "198.51.100.1",
            "203.0.113.1",
            "198.18.0.1",
            "224.0.0.1",
            "240.0.0.1",
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "2002:a00:1::1",
            "2001::1",
        ] {
            assert!(!is_public(private.parse().expect("ip")), "{private}");
        }
    }
}
