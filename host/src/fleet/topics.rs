//! The fleet's three topics, created with the configs they need or refused, naming the config,
//! when they exist with wrong ones: a deployments topic (one partition: one total order;
//! compacted), a components topic (content-addressed chunks; compacted) and a status topic
//! (one record per host, compacted, and deleted after a retention so dead hosts age out).

use crate::kafka::{KafkaClient, KafkaError};
use crate::manifest::FleetSpec;

/// Bytes a components record may have: a chunk plus its key and framing.
const COMPONENTS_MAX_MESSAGE_BYTES: &str = "1048588";
/// The status topic's segments roll this often (1 h), so compaction and retention reach them.
const STATUS_SEGMENT_MS: &str = "3600000";

/// The names of a fleet's topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    /// Operator actions and canary decisions, in one total order.
    pub deployments: String,
    /// Component bytes, in chunks keyed by digest.
    pub components: String,
    /// One status per host.
    pub status: String,
}

impl Topics {
    /// The topics of `spec`'s fleet.
    pub fn of(spec: &FleetSpec) -> Topics {
        let base = format!("{}{}", spec.topic_prefix, spec.name);
        Topics {
            deployments: format!("{base}.deployments"),
            components: format!("{base}.components"),
            status: format!("{base}.status"),
        }
    }
}

/// Why the fleet's topics cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    /// The cluster refused or failed a request.
    #[error("fleet topic {topic}: {error}")]
    Kafka {
        /// The topic.
        topic: String,
        /// What the cluster said.
        error: KafkaError,
    },
    /// The topic exists with a config the fleet cannot work with.
    #[error(
        "fleet topic {topic} exists with {config} = {found}, but the fleet needs {needed}: change it (kafka-configs --alter) or name other topics with fleet.topic_prefix"
    )]
    WrongConfig {
        /// The topic.
        topic: String,
        /// The config.
        config: String,
        /// What it is.
        found: String,
        /// What the fleet needs.
        needed: String,
    },
}

/// Creates the fleet's topics where missing, and checks the ones that exist.
pub async fn ensure(client: &KafkaClient, spec: &FleetSpec) -> Result<Topics, TopicError> {
    let t = Topics::of(spec);
    let retention = spec.status_retention_ms.to_string();
    let wanted: [(&str, Vec<(&str, &str)>); 3] = [
        (&t.deployments, vec![("cleanup.policy", "compact")]),
        (
            &t.components,
            vec![
                ("cleanup.policy", "compact"),
                ("max.message.bytes", COMPONENTS_MAX_MESSAGE_BYTES),
            ],
        ),
        (
            &t.status,
            vec![
                ("cleanup.policy", "compact,delete"),
                ("retention.ms", &retention),
                ("segment.ms", STATUS_SEGMENT_MS),
            ],
        ),
    ];
    let kafka = |topic: &str| {
        let topic = topic.to_owned();
        move |error| TopicError::Kafka { topic, error }
    };
    let names: Vec<String> = wanted.iter().map(|(n, _)| (*n).to_owned()).collect();
    client
        .refresh_metadata(&names)
        .await
        .map_err(kafka(&t.deployments))?;
    let brokers = i16::try_from(client.broker_ids().len().max(1)).unwrap_or(1);
    let replication = spec.replication_factor.unwrap_or(3).min(brokers);
    for (name, configs) in &wanted {
        match client.topic(name) {
            None => {
                match client.create_topic(name, 1, replication, configs).await {
                    Ok(_) => tracing::info!(topic = %name, "created the fleet topic"),
                    // Another host made it first: check it like any existing one.
                    Err(e) if e.to_string().contains("TopicAlreadyExists") => {
                        check(client, name, configs).await?
                    }
                    Err(e) => return Err(kafka(name)(e)),
                }
            }
            Some(meta) => {
                if meta.partitions.len() != 1 {
                    return Err(TopicError::WrongConfig {
                        topic: (*name).to_owned(),
                        config: "partitions".into(),
                        found: meta.partitions.len().to_string(),
                        needed: "1 (one total order)".into(),
                    });
                }
                check(client, name, configs).await?;
            }
        }
    }
    Ok(t)
}

/// Checks the configs of an existing topic: the cleanup policy must hold the policies the
/// fleet needs; the rest are what the fleet would set, so only a smaller message size refuses.
async fn check(
    client: &KafkaClient,
    name: &str,
    configs: &[(&str, &str)],
) -> Result<(), TopicError> {
    for (key, needed) in configs {
        let found = client
            .topic_config(name, key)
            .await
            .map_err(|error| TopicError::Kafka {
                topic: name.to_owned(),
                error,
            })?
            .unwrap_or_default();
        let ok = match *key {
            "cleanup.policy" => needed
                .split(',')
                .all(|p| found.split(',').any(|f| f.trim() == p)),
            "max.message.bytes" => found
                .parse::<u64>()
                .ok()
                .zip(needed.parse::<u64>().ok())
                .is_some_and(|(f, n)| f >= n),
            _ => true,
        };
        if !ok {
            return Err(TopicError::WrongConfig {
                topic: name.to_owned(),
                config: (*key).to_owned(),
                found,
                needed: (*needed).to_owned(),
            });
        }
    }
    Ok(())
}
