//! `[fleet]`: the fleet a host belongs to ([`FleetSpec`]), and its validator. With it, which
//! plugin version each pipeline runs (deploys, shadows, canaries, promotions, rollbacks) comes
//! from the fleet's Kafka topics, signed by a trusted key; the manifest stays the host's
//! boundary (what a pipeline may reach). A fleet needs `[trust]` with at least one key: write
//! access to a topic must never be enough to deploy.

use std::sync::Arc;

use toml::Spanned;

use super::context::{Ctx, valid_name};
use super::defaults;
use super::error::ManifestError;
use super::raw::RawFleet;
use crate::runtime::TrustPolicy;

/// The fleet this host is one of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetSpec {
    /// The fleet's name (every host of the fleet names the same one).
    pub name: String,
    /// This host's id in the fleet; `None`: the machine's host name (a pod's name), else one
    /// made up from the process id.
    pub host_id: Option<String>,
    /// Prefix of the fleet's topic names (`<prefix><name>.deployments` and the others).
    pub topic_prefix: String,
    /// Replication factor of the topics the fleet creates; `None`: 3, or the brokers there
    /// are when fewer.
    pub replication_factor: Option<i16>,
    /// How often the host publishes its status, in ms.
    pub status_interval_ms: u64,
    /// A host whose last status is older than this is shown stale, in ms.
    pub stale_after_ms: u64,
    /// How long the status topic keeps a silent host, in ms.
    pub status_retention_ms: u64,
    /// The most hosts a reader of the status topic keeps (the oldest dropped past it): anyone
    /// who can write the topic can make hosts up, and each costs memory and a row of the view.
    pub max_hosts: usize,
    /// The keys operator actions must be signed by (the host's `[trust]`).
    pub trust: Arc<TrustPolicy>,
}

/// `[fleet] max_hosts` when unset: far more hosts than one fleet of share-group consumers
/// runs (a group's members are bounded by its partitions), far fewer than a flood of forged
/// statuses writes.
pub const DEFAULT_MAX_HOSTS: usize = 1_000;

/// Validates `[fleet]` (at `span`) against the host's `[trust]`.
pub(super) fn validate(
    cx: &Ctx<'_>,
    raw: &Spanned<RawFleet>,
    trust: Option<&Arc<TrustPolicy>>,
) -> Result<FleetSpec, ManifestError> {
    let f = raw.get_ref();
    let name = f.name.get_ref();
    if !valid_name(name) {
        return Err(cx.err(
            Some(f.name.span()),
            "fleet.name",
            format!(
                "{name:?} is not a name: letters, digits, '.', '_' and '-' only, 1 to 128 of them"
            ),
        ));
    }
    let Some(trust) = trust else {
        return Err(cx.err(
            Some(raw.span()),
            "fleet",
            "a fleet needs [trust] with at least one key: deployments arrive through Kafka and \
             are applied only when signed by a trusted key",
        ));
    };
    let host_id = match &f.host_id {
        Some(h) if !valid_name(h.get_ref()) => {
            return Err(cx.err(
                Some(h.span()),
                "fleet.host_id",
                format!(
                    "{:?} is not a name: letters, digits, '.', '_' and '-' only",
                    h.get_ref()
                ),
            ));
        }
        h => h.as_ref().map(|h| h.get_ref().clone()),
    };
    let topic_prefix = match &f.topic_prefix {
        Some(p)
            if !p
                .get_ref()
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) =>
        {
            return Err(cx.err(
                Some(p.span()),
                "fleet.topic_prefix",
                "a topic name takes letters, digits, '.', '_' and '-' only",
            ));
        }
        p => p.as_ref().map_or_else(
            || defaults::FLEET_TOPIC_PREFIX.to_owned(),
            |p| p.get_ref().clone(),
        ),
    };
    let replication_factor = match &f.replication_factor {
        Some(_) => Some(cx.int(
            &f.replication_factor,
            "fleet.replication_factor",
            1..=16,
            3i16,
        )?),
        None => None,
    };
    let status_interval_ms = cx.int(
        &f.status_interval_ms,
        "fleet.status_interval_ms",
        100..=600_000,
        defaults::FLEET_STATUS_INTERVAL_MS,
    )?;
    let stale_after_ms = cx.int(
        &f.stale_after_ms,
        "fleet.stale_after_ms",
        1_000..=86_400_000,
        defaults::FLEET_STALE_AFTER_MS,
    )?;
    if stale_after_ms <= status_interval_ms {
        return Err(cx.err(
            f.stale_after_ms.as_ref().map(|s| s.span()),
            "fleet.stale_after_ms",
            format!("must be longer than fleet.status_interval_ms ({status_interval_ms}), or every host would look stale"),
        ));
    }
    let status_retention_ms = cx.int(
        &f.status_retention_ms,
        "fleet.status_retention_ms",
        60_000..=31_536_000_000,
        defaults::FLEET_STATUS_RETENTION_MS,
    )?;
    let max_hosts = cx.int(
        &f.max_hosts,
        "fleet.max_hosts",
        1..=100_000,
        DEFAULT_MAX_HOSTS,
    )?;
    Ok(FleetSpec {
        name: name.clone(),
        host_id,
        topic_prefix,
        replication_factor,
        status_interval_ms,
        stale_after_ms,
        status_retention_ms,
        max_hosts,
        trust: trust.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::{MINIMAL, parse};
    use super::DEFAULT_MAX_HOSTS;

    fn with_fleet(extra: &str) -> String {
        let key = minisign::KeyPair::generate_unencrypted_keypair()
            .expect("key pair")
            .pk
            .to_base64();
        format!("[trust]\nkeys = [\"{key}\"]\n\n[fleet]\nname = \"f\"\n{extra}\n{MINIMAL}")
    }

    #[test]
    fn max_hosts_has_a_default_and_a_bound_named_when_refused() {
        let m = parse(&with_fleet("")).expect("valid");
        assert_eq!(m.fleet.map(|f| f.max_hosts), Some(DEFAULT_MAX_HOSTS));
        let m = parse(&with_fleet("max_hosts = 5")).expect("valid");
        assert_eq!(m.fleet.map(|f| f.max_hosts), Some(5));
        for bad in ["max_hosts = 0", "max_hosts = 100001"] {
            let e = parse(&with_fleet(bad)).expect_err(bad).to_string();
            assert!(e.contains("fleet.max_hosts") && e.contains("100000"), "{e}");
        }
    }
}
