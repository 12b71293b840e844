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
