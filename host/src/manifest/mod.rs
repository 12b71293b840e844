//! The manifest: what `sharehost run` and `sharehost check` read. TOML with unknown fields
//! refused, every value checked, and every error pointing at the file, line and field.
//!
//! Read in two steps, each in rooms of its own:
//! - `raw`: the TOML shape as written (serde, unknown fields refused, values kept with their
//!   position in the text); nothing is checked there but the shape.
//! - one validator per table turns it into the specs the host runs on, resolving paths against
//!   the manifest's folder and filling in [`defaults`]: `cluster` (`[cluster]`, into
//!   [`ClusterSpec`]), `admin` (`[admin]`, [`AdminSpec`]), `runtime` (`[runtime]`,
//!   [`RuntimeSpec`]), `trust` (`[trust]` and `[pipeline.trust]`), `pipeline` (`[[pipeline]]`,
//!   [`PipelineSpec`]), and `grants` (a pipeline's outputs, secrets and outbound HTTP).
//!
//! Beside them: `error` ([`ManifestError`], located by line, column and field), `context`
//! (what every validator shares: the text to locate errors in, range and choice checks,
//! relative paths), `secret` ([`SecretSource`]: where a secret lives) and [`defaults`].
//!
//! The reference with every field, its default and an example is `docs/manifest.md`.

mod admin;
mod cluster;
mod context;
pub mod defaults;
mod error;
mod grants;
mod pipeline;
mod raw;
mod runtime;
mod secret;
mod trust;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use admin::AdminSpec;
pub use cluster::{ClusterSpec, SaslSpec};
pub use error::ManifestError;
pub use pipeline::{FaultPolicy, InstanceModeSpec, PipelineSpec, ShadowSpec};
pub use runtime::RuntimeSpec;
pub use secret::SecretSource;

use crate::runtime::{RuntimeConfig, TrustPolicy};
use context::Ctx;
use raw::RawManifest;

/// A validated manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// The file it came from.
    pub path: PathBuf,
    /// The cluster.
    pub cluster: ClusterSpec,
    /// The admin listener.
    pub admin: AdminSpec,
    /// Host-wide runtime settings.
    pub runtime: RuntimeSpec,
    /// The host's trusted keys (`[trust]`): every pipeline without its own `[pipeline.trust]`
    /// requires components signed by one of them.
    pub trust: Option<Arc<TrustPolicy>>,
    /// The pipelines, in file order.
    pub pipelines: Vec<PipelineSpec>,
}

impl Manifest {
    /// Plugin runtime settings sized for every pipeline here: the largest memory limit, and
    /// instances for each pipeline's workers, a canary's set beside them, a hot-swap's or
    /// rollback's new set while the old one finishes, and a shadow's one plus two spare
    /// (3 × concurrency + 3), so `sharehost run` and the benchmark host reserve the same. The
    /// precompiled cache is the caller's choice.
    pub fn runtime_config(&self) -> RuntimeConfig {
        let max_plugin_memory = self
            .pipelines
            .iter()
            .map(|p| p.memory_limit)
            .max()
            .unwrap_or(defaults::MEMORY_LIMIT_MIB << 20);
        let instances: usize = self.pipelines.iter().map(|p| p.concurrency * 3 + 3).sum();
        RuntimeConfig {
            max_plugin_memory,
            max_instances: u32::try_from(instances.max(4)).unwrap_or(64),
            max_component_bytes: self.runtime.max_component_bytes,
            ..RuntimeConfig::default()
        }
    }

    /// Reads and validates a manifest file.
    pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| ManifestError::unreadable(path, &e))?;
        Self::parse(path, &text)
    }

    /// Validates manifest text; `path` names it in errors and anchors relative paths. The
    /// tables are checked one after another (cluster, admin, runtime, trust, then each pipeline
    /// in file order), and the first error is the one returned.
    pub fn parse(path: &Path, text: &str) -> Result<Manifest, ManifestError> {
        let raw: RawManifest =
            toml::from_str(text).map_err(|e| ManifestError::from_toml(path, text, &e))?;
        let cx = Ctx { file: path, text };
        let cluster = cluster::validate(&cx, &raw.cluster)?;
        let admin = admin::validate(&cx, raw.admin.as_ref())?;
        let runtime = runtime::validate(&cx, raw.runtime.as_ref())?;
        let trust = match &raw.trust {
            Some(t) => Some(trust::validate(&cx, t, "trust")?),
            None => None,
        };
        let pipelines = pipeline::validate_all(
            &cx,
            &raw.pipelines,
            runtime.max_component_bytes,
            trust.as_ref(),
        )?;
        Ok(Manifest {
            path: path.to_path_buf(),
            cluster,
            admin,
            runtime,
            trust,
            pipelines,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("sharehost-manifest-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("tmp");
        std::fs::write(d.join("plugin.wasm"), b"not really").expect("write");
        d
    }

    fn parse(text: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse(&dir().join("m.toml"), text)
    }

    const MINIMAL: &str = r#"
[cluster]
bootstrap = "127.0.0.1:9092"

[[pipeline]]
name = "orders"
topics = ["orders"]
group = "orders-g"
component = "plugin.wasm"
"#;

    #[test]
    fn outputs_secrets_http_and_deadlines_of_a_plugin_that_acts_are_parsed() {
        let text = format!(
            "{MINIMAL}wall_deadline_ms = 9000\nmax_retry_delay_ms = 1000\nallowed_outbound_hosts = [\"http://127.0.0.1:8088\"]\nhttp_max_concurrent = 4\n[pipeline.outputs]\nvalid = \"orders-valid\"\n[pipeline.secrets]\napi-token = {{ env = \"SHAREHOST_TEST_TOKEN_UNSET\" }}\n"
        );
        let m = parse(&text).expect("valid");
        let p = &m.pipelines[0];
        assert_eq!(p.wall_deadline, Duration::from_secs(9));
        assert_eq!(p.max_retry_delay, Duration::from_secs(1));
        assert_eq!(
            p.outputs.get("valid").map(String::as_str),
            Some("orders-valid")
        );
        let http = p.http.as_ref().expect("http granted");
        assert_eq!(http.allowed_outbound_hosts, ["http://127.0.0.1:8088"]);
        assert_eq!(http.max_concurrent, 4);
        assert_eq!(
            http.request_timeout,
            Duration::from_millis(defaults::HTTP_TIMEOUT_MS)
        );
        // The secret is read at load, and its error names it and its source, no value.
        let e = p.resolve_secrets().expect_err("variable unset");
        assert!(
            e.contains("secrets.api-token") && e.contains("SHAREHOST_TEST_TOKEN_UNSET"),
            "{e}"
        );
        // A minimal pipeline grants nothing: no outputs, no hosts, no secrets.
        let m = parse(MINIMAL).expect("valid");
        let p = &m.pipelines[0];
        assert!(p.outputs.is_empty() && p.http.is_none() && p.secrets.is_empty());
        assert_eq!(
            p.wall_deadline,
            p.cpu_deadline * 3,
            "three CPU budgets by default"
        );
    }

    #[test]
    fn a_plugin_that_acts_is_refused_bad_grants_naming_the_key() {
        for (extra, key, why) in [
            (
                "wall_deadline_ms = 10\n",
                "wall_deadline_ms",
                "at least cpu_deadline_ms",
            ),
            (
                "[pipeline.outputs]\nloop = \"orders\"\n",
                "outputs.loop",
                "would loop",
            ),
            (
                "[pipeline.outputs]\n\"bad name\" = \"t\"\n",
                "outputs.bad name",
                "letters, digits",
            ),
            (
                "[pipeline.secrets]\nt = { env = \"A\", file = \"b\" }\n",
                "secrets.t",
                "exactly one of",
            ),
            (
                "[pipeline.secrets]\nt = { }\n",
                "secrets.t",
                "exactly one of",
            ),
            (
                "http_timeout_ms = 100\n",
                "http_timeout_ms",
                "without allowed_outbound_hosts",
            ),
        ] {
            let e = parse(&format!("{MINIMAL}{extra}")).expect_err(extra);
            let text = e.to_string();
            assert!(text.contains(key) && text.contains(why), "{extra}: {text}");
        }
    }

    #[test]
    fn a_minimal_manifest_gets_the_documented_defaults() {
        let m = parse(MINIMAL).expect("valid");
        let p = &m.pipelines[0];
        assert_eq!(p.batch_size, defaults::BATCH_SIZE);
        assert_eq!(p.max_in_flight, defaults::MAX_IN_FLIGHT);
        assert_eq!(p.fault_policy, FaultPolicy::Release);
        assert_eq!(p.instance_mode, InstanceModeSpec::Reuse);
        assert_eq!(p.delivery_cap, None);
        assert_eq!(
            p.component,
            dir().join("plugin.wasm"),
            "relative to the manifest"
        );
        assert_eq!(m.admin.listen, "127.0.0.1:9464");
        assert_eq!(m.cluster.client_id, "sharehost");
    }

    #[test]
    fn unknown_fields_name_line_and_field() {
        let text = MINIMAL.replace(
            "group = \"orders-g\"",
            "group = \"orders-g\"\nbatchsize = 10",
        );
        let e = parse(&text).expect_err("unknown field");
        assert_eq!(e.line, Some(9), "{e}");
        assert!(e.message.contains("unknown field `batchsize`"), "{e}");
    }

    #[test]
    fn bad_values_name_line_and_field() {
        let text = MINIMAL.replace(
            "group = \"orders-g\"",
            "group = \"orders-g\"\nbatch_size = 0",
        );
        let e = parse(&text).expect_err("bad value");
        assert_eq!(
            e.to_string(),
            format!(
                "{}:9:14: pipeline[0].batch_size: must be between 1 and 10000 (got 0)",
                dir().join("m.toml").display()
            )
        );
    }

    #[test]
    fn a_component_path_that_is_not_a_regular_file_says_what_it_is() {
        let d = dir().join("a-directory.wasm");
        std::fs::create_dir_all(&d).expect("dir");
        let e =
            parse(&MINIMAL.replace("plugin.wasm", "a-directory.wasm")).expect_err("a directory");
        assert_eq!(e.field.as_deref(), Some("pipeline[0].component"));
        assert_eq!(e.message, format!("{}: is a directory", d.display()));
        let e = parse(&MINIMAL.replace("plugin.wasm", "/dev/zero")).expect_err("a device");
        assert_eq!(
            e.message,
            "/dev/zero: is a character device, not a regular file"
        );
        let e = parse(&MINIMAL.replace("plugin.wasm", "absent.wasm")).expect_err("absent");
        assert!(e.message.ends_with("absent.wasm does not exist"), "{e}");
    }

    #[test]
    fn the_component_size_limit_is_a_runtime_key() {
        let m = parse(MINIMAL).expect("valid");
        assert_eq!(m.runtime.max_component_bytes, 64 << 20);
        assert_eq!(m.runtime_config().max_component_bytes, 64 << 20);
        let text = format!("[runtime]\nmax_component_mib = 2\n{MINIMAL}");
        let m = parse(&text).expect("valid");
        assert_eq!(m.runtime_config().max_component_bytes, 2 << 20);
        // A component file over the maximum is refused by the manifest check, naming the key.
        let big = dir().join("big.wasm");
        std::fs::File::create(&big)
            .expect("create")
            .set_len(3 << 20)
            .expect("grow");
        let e = parse(&text.replace("plugin.wasm", "big.wasm")).expect_err("too big");
        assert!(
            e.message
                .contains("is 3 MiB, more than the 2 MiB maximum (runtime.max_component_mib"),
            "{e}"
        );
        let e = parse(&format!("[runtime]\nmax_component_mib = 0\n{MINIMAL}")).expect_err("0");
        assert_eq!(e.field.as_deref(), Some("runtime.max_component_mib"));
    }

    /// Two minisign public keys (their secret halves were never kept) and their ids.
    const ALICE: &str = "RWRHs4BcChVSimkp37yexDX7kT2h9Qc3la9J7aDfSJlRObr3f7mo+D3W";
    const ALICE_ID: &str = "8A52150A5C80B347";
    const BOB: &str = "RWQBAgMEBQYHCAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    const BOB_ID: &str = "0807060504030201";

    #[test]
    fn trusted_keys_come_from_the_host_or_replace_it_per_pipeline() {
        // No [trust]: no signature needed.
        let m = parse(MINIMAL).expect("valid");
        assert!(m.trust.is_none() && m.pipelines[0].trust.is_none());
        // The host's keys apply to every pipeline without its own.
        let text = format!("[trust]\nkeys = [\"{ALICE}\"]\n{MINIMAL}");
        let m = parse(&text).expect("valid");
        let ids = |p: &PipelineSpec| p.trust.as_ref().map(|t| t.key_ids().join(","));
        assert_eq!(ids(&m.pipelines[0]).as_deref(), Some(ALICE_ID));
        // A pipeline's own list replaces the host's; a keys file adds to the inline keys.
        let keys = dir().join("trusted.pub");
        std::fs::write(
            &keys,
            format!("untrusted comment: minisign public key {BOB_ID}\n{BOB}\n"),
        )
        .expect("write");
        let own = format!("{text}[pipeline.trust]\nkeys_file = \"trusted.pub\"\n");
        let m = parse(&own).expect("valid");
        assert_eq!(ids(&m.pipelines[0]).as_deref(), Some(BOB_ID));
        assert_eq!(
            m.trust.as_ref().map(|t| t.key_ids().join(",")).as_deref(),
            Some(ALICE_ID)
        );
        let both = own.replace(
            "keys_file = ",
            &format!("keys = [\"{ALICE}\"]\nkeys_file = "),
        );
        let m = parse(&both).expect("valid");
        assert_eq!(
            ids(&m.pipelines[0]).as_deref(),
            Some(format!("{ALICE_ID},{BOB_ID}").as_str())
        );
    }

    #[test]
    fn a_bad_trusted_key_or_an_empty_trust_table_is_refused_naming_the_field() {
        std::fs::write(dir().join("not-keys.pub"), "not a key\n").expect("write");
        for (text, field, why) in [
            (
                format!("[trust]\nkeys = [\"{ALICE}\", \"RWQnope\"]\n{MINIMAL}"),
                "trust.keys[1]",
                "is not base64",
            ),
            (
                format!("{MINIMAL}[pipeline.trust]\nkeys = [\"aGVsbG8=\"]\n"),
                "pipeline[0].trust.keys[0]",
                "not a minisign public key",
            ),
            (
                format!("[trust]\nkeys = [\"{ALICE}\"]\n{MINIMAL}[pipeline.trust]\nkeys = []\n"),
                "pipeline[0].trust",
                "cannot opt out",
            ),
            (
                format!("[trust]\nkeys_file = \"absent.pub\"\n{MINIMAL}"),
                "trust.keys_file",
                "cannot read",
            ),
            (
                format!("[trust]\nkeys_file = \"not-keys.pub\"\n{MINIMAL}"),
                "trust.keys_file",
                "line 1: ",
            ),
        ] {
            let e = parse(&text).expect_err(field);
            assert_eq!(e.field.as_deref(), Some(field), "{e}");
            assert!(e.message.contains(why), "{e}");
            assert!(e.line.is_some(), "{e}");
        }
        let e = parse(&format!("[trust]\nkey = [\"{ALICE}\"]\n{MINIMAL}")).expect_err("typo");
        assert!(e.message.contains("unknown field `key`"), "{e}");
    }

    #[test]
    fn sasl_secrets_come_from_the_environment_or_a_file() {
        let text = MINIMAL.replace(
            "bootstrap = \"127.0.0.1:9092\"",
            "bootstrap = \"127.0.0.1:9092\"\nsasl = { mechanism = \"SCRAM-SHA-512\", username = \"u\", password_env = \"SHAREHOST_TEST_PW_UNSET\" }",
        );
        let m = parse(&text).expect("valid");
        let e = m.cluster.sasl_settings().expect_err("unset");
        assert!(e.contains("SHAREHOST_TEST_PW_UNSET"), "{e}");
        let both = text.replace("password_env", "password_file = \"x\", password_env");
        assert!(
            parse(&both)
                .expect_err("both")
                .message
                .contains("exactly one")
        );
    }
}
