//! Broker addresses and the bootstrap list, parsed strictly so a typo is reported by name.

use std::fmt;

/// A broker's network address plus, once known from metadata, its node id. Used as the
/// "which broker" in every error.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BrokerAddr {
    /// Node id from metadata; `None` for a bootstrap address not yet identified.
    pub id: Option<i32>,
    /// Host name or IP literal (without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl BrokerAddr {
    /// An address not yet tied to a node id.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        BrokerAddr {
            id: None,
            host: host.into(),
            port,
        }
    }

    /// The same address tagged with the node id learned from metadata.
    pub fn with_id(mut self, id: i32) -> Self {
        self.id = Some(id);
        self
    }

    /// `host:port` suitable for `TcpStream::connect` (IPv6 literals bracketed).
    pub fn socket_addr_string(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for BrokerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.id {
            Some(id) => write!(f, "broker {id} ({})", self.socket_addr_string()),
            None => write!(f, "bootstrap broker {}", self.socket_addr_string()),
        }
    }
}

/// Why a bootstrap list cannot be read: the entry and what is wrong with it (a configuration
/// error of the user's, [`crate::KafkaError::Config`] where a client meets it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AddrError(pub String);

/// Parses a comma-separated bootstrap list (`host:port,host:port`, IPv6 as `[::1]:9092`).
///
/// Every entry must carry an explicit port: silently defaulting to 9092 hides typos.
pub fn parse_bootstrap(list: &str) -> Result<Vec<BrokerAddr>, AddrError> {
    let mut out = Vec::new();
    for raw in list.split(',') {
        let entry = raw.trim();
        if entry.is_empty() {
            continue;
        }
        out.push(parse_one(entry)?);
    }
    if out.is_empty() {
        return Err(AddrError(format!(
            "bootstrap address {list:?} is empty: expected host:port[,host:port...]"
        )));
    }
    Ok(out)
}

fn parse_one(entry: &str) -> Result<BrokerAddr, AddrError> {
    let bad = |why: &str| {
        AddrError(format!(
            "invalid bootstrap address {entry:?}: {why} (expected host:port, e.g. 127.0.0.1:9092)"
        ))
    };
    if entry.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(bad("contains a space or '/'"));
    }
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(|| bad("missing ']'"))?;
        let port = after.strip_prefix(':').ok_or_else(|| bad("missing port"))?;
        (host, port)
    } else {
        let (host, port) = entry.rsplit_once(':').ok_or_else(|| bad("missing port"))?;
        if host.contains(':') {
            return Err(bad("IPv6 addresses must be written in brackets"));
        }
        (host, port)
    };
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| bad("port is not a number in 1..=65535"))?;
    if port == 0 {
        return Err(bad("port is not a number in 1..=65535"));
    }
    Ok(BrokerAddr::new(host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_ipv6() {
        let v = parse_bootstrap("127.0.0.1:9092, kafka-1:19092,[::1]:9093").expect("valid");
        assert_eq!(v.len(), 3);
        assert_eq!(v[1], BrokerAddr::new("kafka-1", 19092));
        assert_eq!(v[2].host, "::1");
        assert_eq!(v[2].socket_addr_string(), "[::1]:9093");
    }

    #[test]
    fn malformed_entries_are_named() {
        for (input, needle) in [
            ("localhost", "missing port"),
            ("localhost:abc", "port is not a number"),
            ("localhost:0", "port is not a number"),
            (":9092", "empty host"),
            ("::1:9092", "brackets"),
            ("", "is empty"),
            ("http://x:1", "'/'"),
        ] {
            let e = parse_bootstrap(input).expect_err(input).to_string();
            assert!(e.contains(needle), "{input}: {e}");
            if !input.is_empty() {
                assert!(e.contains(&format!("{input:?}")), "{input}: {e}");
            }
        }
    }
}
