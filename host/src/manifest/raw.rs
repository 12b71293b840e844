//! The manifest as written: the TOML shape serde reads, with nothing checked but the shape.
//!
//! Every table refuses unknown fields, so a typo is an error rather than a default silently
//! taken. Values the validators check keep their `Spanned` position, so an error can point at
//! the line and column where the value is written. The field order of each struct is the order
//! serde lists the expected fields in when it refuses an unknown one (the golden errors show it).

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// Top-level TOML shape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawManifest {
    pub(super) cluster: RawCluster,
    #[serde(default)]
    pub(super) admin: Option<RawAdmin>,
    #[serde(default)]
    pub(super) runtime: Option<RawRuntime>,
    #[serde(default)]
    pub(super) trust: Option<Spanned<RawTrust>>,
    #[serde(default)]
    pub(super) fleet: Option<Spanned<RawFleet>>,
    #[serde(default)]
    pub(super) telemetry: Option<Spanned<RawTelemetry>>,
    #[serde(default, rename = "pipeline")]
    pub(super) pipelines: Vec<RawPipeline>,
}

/// `[telemetry]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    pub(super) otlp_endpoint: Spanned<String>,
    #[serde(default)]
    pub(super) sample: Option<Spanned<f64>>,
    #[serde(default)]
    pub(super) service_name: Option<Spanned<String>>,
}

/// `[fleet]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFleet {
    pub(super) name: Spanned<String>,
    #[serde(default)]
    pub(super) host_id: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) topic_prefix: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) replication_factor: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) status_interval_ms: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) stale_after_ms: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) status_retention_ms: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) max_hosts: Option<Spanned<i64>>,
}

/// `[cluster]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCluster {
    pub(super) bootstrap: Spanned<String>,
    #[serde(default)]
    pub(super) client_id: Option<String>,
    #[serde(default)]
    pub(super) tls: Option<RawTls>,
    #[serde(default)]
    pub(super) sasl: Option<Spanned<RawSasl>>,
}

/// `[cluster.tls]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    #[serde(default)]
    pub(super) ca_file: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) cert_file: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) key_file: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) server_name: Option<String>,
}

/// `[cluster.sasl]`: the password is named by where it lives, never written here.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSasl {
    pub(super) mechanism: Spanned<String>,
    pub(super) username: Spanned<String>,
    #[serde(default)]
    pub(super) password_env: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) password_file: Option<Spanned<String>>,
}

/// `[admin]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    #[serde(default)]
    pub(super) listen: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) token_env: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) allowed_hosts: Option<Spanned<Vec<Spanned<String>>>>,
}

/// `[runtime]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRuntime {
    #[serde(default)]
    pub(super) max_component_mib: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) max_function_operators: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) max_function_nesting: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) max_function_loop_locals: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) max_function_stack: Option<Spanned<i64>>,
}

/// `[trust]` and `[pipeline.trust]`: minisign public keys, inline and/or in a file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTrust {
    #[serde(default)]
    pub(super) keys: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub(super) keys_file: Option<Spanned<String>>,
}

/// `[pipeline.schema]`: the schema registry and how keys, values and emits are encoded.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSchema {
    pub(super) registry: Spanned<String>,
    #[serde(default)]
    pub(super) value: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) key: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) outputs: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    pub(super) ca_file: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) username: Option<Spanned<String>>,
    // Read as plain TOML values, as `[pipeline.secrets]` are: never quoted back.
    #[serde(default)]
    pub(super) password: Option<Spanned<toml::Value>>,
    #[serde(default)]
    pub(super) token: Option<Spanned<toml::Value>>,
}

/// `[[pipeline]]`, with its `outputs`, `secrets` and `trust` sub-tables.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPipeline {
    pub(super) name: Spanned<String>,
    pub(super) topics: Spanned<Vec<String>>,
    pub(super) group: Spanned<String>,
    pub(super) component: Spanned<String>,
    #[serde(default)]
    pub(super) config: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) batch_size: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) max_in_flight: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) delivery_cap: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) fault_policy: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) guarantee: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) cpu_deadline_ms: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) memory_limit_mib: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) instance_mode: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) recycle_after: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) concurrency: Option<Spanned<i64>>,
    #[serde(default)]
    // A string ("earliest", "latest") or a table ({ by_duration = "PT1H" }): read as a TOML
    // value and interpreted by hand, so the error can name both forms.
    pub(super) start: Option<Spanned<toml::Value>>,
    #[serde(default)]
    pub(super) dead_letter_topic: Option<Spanned<String>>,
    pub(super) broker_dead_letter_topic: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) max_renewals: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) auto_renew_after: Option<Spanned<f64>>,
    #[serde(default)]
    pub(super) wall_deadline_ms: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) max_retry_delay_ms: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) outputs: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    pub(super) max_emits_per_batch: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) max_emit_bytes_per_batch: Option<Spanned<i64>>,
    #[serde(default)]
    // Read as plain TOML values and interpreted by hand: serde's own error for a string where
    // `{ env = .. }` belongs would quote the string, i.e. the secret someone put in the manifest.
    pub(super) secrets: BTreeMap<String, Spanned<toml::Value>>,
    #[serde(default)]
    pub(super) allowed_outbound_hosts: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub(super) http_timeout_ms: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) http_max_response_bytes: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) http_max_concurrent: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) http_ca_file: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) trust: Option<Spanned<RawTrust>>,
    #[serde(default)]
    pub(super) schema: Option<Spanned<RawSchema>>,
    #[serde(default)]
    pub(super) shadow: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) shadow_sample: Option<Spanned<f64>>,
}
