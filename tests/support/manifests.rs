//! Manifests the tests run a host with.

/// The pipeline settings the fault suite and `dev/chaos` run the ledger plugin with: small
/// batches and a low in-flight bound (so a fault always catches records mid-flight), a delivery
/// cap below the broker's limit, and two batches judged at once.
pub const FAULT_SETTINGS: &str =
    "batch_size = 50\nmax_in_flight = 500\ndelivery_cap = 4\nconcurrency = 2\n";

/// The text of a manifest with one pipeline named `ledger` (admin on an ephemeral loopback
/// port) that runs `component` on `topic` in `group`, with the plugin configuration
/// `plugin_config` (TOML inline-table entries) and `settings` (more pipeline lines).
pub fn ledger_manifest(
    bootstrap: &str,
    topic: &str,
    group: &str,
    component: &std::path::Path,
    plugin_config: &str,
    settings: &str,
) -> String {
    format!(
        r#"[cluster]
bootstrap = "{bootstrap}"

[admin]
listen = "127.0.0.1:0"

[[pipeline]]
name = "ledger"
topics = ["{topic}"]
group = "{group}"
component = "{component}"
config = {{ {plugin_config} }}
{settings}"#,
        component = component.display(),
    )
}

/// The text of a manifest that `sharehost test-plugin` runs the fraud check with on topic
/// `orders`, its values and its `scored` output (topic `scored_topic`) in `format`, the scoring
/// service at `score_url` granted, its token in `SCORING_TOKEN`. The registry it names answers
/// nowhere: a run that asked it would fail, so the schemas must come from `--schema-file`.
pub fn offline_schema_manifest(
    component: &std::path::Path,
    score_url: &str,
    format: &str,
    scored_topic: &str,
) -> String {
    format!(
        r#"[cluster]
bootstrap = "127.0.0.1:9"

[[pipeline]]
name = "fraud-check"
topics = ["orders"]
group = "g"
component = "{component}"
config = {{ score-url = "{score_url}/score" }}
allowed_outbound_hosts = ["{score_url}"]
[pipeline.outputs]
scored = "{scored_topic}"
[pipeline.secrets]
scoring-token = {{ env = "SCORING_TOKEN" }}
[pipeline.schema]
registry = "http://127.0.0.1:9/apis/ccompat/v7"
value = "{format}"
[pipeline.schema.outputs]
scored = "{format}"
"#,
        component = component.display(),
    )
}
