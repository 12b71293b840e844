//! What a pipeline grants its plugin beyond its records: the topics it may emit to
//! (`[pipeline.outputs]` and the emit limits), the secrets handed to `init`
//! (`[pipeline.secrets]`), and outbound HTTP (`allowed_outbound_hosts` and the `http_*` keys).
//! The manifest grants; the runtime enforces.

use std::collections::BTreeMap;
use std::time::Duration;

use toml::Spanned;

use super::context::{Ctx, valid_name};
use super::defaults;
use super::error::ManifestError;
use super::raw::RawPipeline;
use super::secret::SecretSource;
use crate::runtime::{HttpGrant, HttpSettings};

/// `[pipeline.outputs]`: output name to topic, never one of the pipeline's own topics.
/// `field` names the pipeline (`pipeline[i]`).
pub(super) fn outputs(
    cx: &Ctx<'_>,
    p: &RawPipeline,
    field: &str,
) -> Result<BTreeMap<String, String>, ManifestError> {
    let mut outputs = BTreeMap::new();
    for (out, topic) in &p.outputs {
        let field = format!("{field}.outputs.{out}");
        if !valid_name(out) {
            return Err(cx.err(
                Some(topic.span()),
                field,
                format!("output name {out:?} must be 1-64 letters, digits, '-' or '_'"),
            ));
        }
        let t = topic.get_ref();
        if t.is_empty() || p.topics.get_ref().contains(t) {
            return Err(cx.err(
                Some(topic.span()),
                field,
                "must name a topic that is not one of the pipeline's own (an output into its own input would loop)",
            ));
        }
        outputs.insert(out.clone(), t.clone());
    }
    Ok(outputs)
}

/// `max_emits_per_batch` and `max_emit_bytes_per_batch`: how much one batch may emit.
pub(super) fn emit_limits(
    cx: &Ctx<'_>,
    p: &RawPipeline,
    field: &str,
) -> Result<(u32, u64), ManifestError> {
    let max_emits = cx.int(
        &p.max_emits_per_batch,
        &format!("{field}.max_emits_per_batch"),
        0..=1_000_000,
        defaults::MAX_EMITS_PER_BATCH,
    )?;
    let max_bytes = cx.int(
        &p.max_emit_bytes_per_batch,
        &format!("{field}.max_emit_bytes_per_batch"),
        0..=(1 << 32),
        defaults::MAX_EMIT_BYTES_PER_BATCH,
    )?;
    Ok((max_emits, max_bytes))
}

/// `[pipeline.secrets]`: each names exactly one of an environment variable or a file. A value
/// written in its place is refused without being quoted.
pub(super) fn secrets(
    cx: &Ctx<'_>,
    p: &RawPipeline,
    field: &str,
) -> Result<Vec<(String, SecretSource)>, ManifestError> {
    let mut secrets = Vec::new();
    for (secret, source) in &p.secrets {
        let field = format!("{field}.secrets.{secret}");
        let table = source.get_ref().as_table();
        let key = |k: &str| table.and_then(|t| t.get(k)).and_then(toml::Value::as_str);
        let only = table.is_some_and(|t| t.len() == 1);
        let source = match (key("env"), key("file")) {
            (Some(var), None) if only && !var.is_empty() => SecretSource::Env(var.to_owned()),
            (None, Some(file)) if only && !file.is_empty() => {
                SecretSource::File(cx.path(&Spanned::new(source.span(), file.to_owned())))
            }
            _ => {
                return Err(cx.err(
                    Some(source.span()),
                    field,
                    "set exactly one of { env = \"VAR\" } or { file = \"path\" } (secrets never go in the manifest)",
                ));
            }
        };
        secrets.push((secret.clone(), source));
    }
    Ok(secrets)
}

/// Outbound HTTP: granted when `allowed_outbound_hosts` lists a host, checked by the runtime's
/// own [`HttpGrant`]. Without one, an `http_*` key is refused rather than silently ignored.
pub(super) fn http(
    cx: &Ctx<'_>,
    p: &RawPipeline,
    field: &str,
) -> Result<Option<HttpSettings>, ManifestError> {
    let f = |name: &str| format!("{field}.{name}");
    let hosts = match &p.allowed_outbound_hosts {
        Some(hosts) if !hosts.get_ref().is_empty() => hosts,
        _ => {
            let stray = [
                (
                    "http_timeout_ms",
                    p.http_timeout_ms.as_ref().map(|s| s.span()),
                ),
                (
                    "http_max_response_bytes",
                    p.http_max_response_bytes.as_ref().map(|s| s.span()),
                ),
                (
                    "http_max_concurrent",
                    p.http_max_concurrent.as_ref().map(|s| s.span()),
                ),
                ("http_ca_file", p.http_ca_file.as_ref().map(|s| s.span())),
            ];
            if let Some((key, span)) = stray.into_iter().find(|(_, s)| s.is_some()) {
                return Err(cx.err(
                    span,
                    f(key),
                    "has no effect without allowed_outbound_hosts (which grants no host yet)",
                ));
            }
            return Ok(None);
        }
    };
    let settings = HttpSettings {
        allowed_outbound_hosts: hosts.get_ref().clone(),
        request_timeout: Duration::from_millis(cx.int(
            &p.http_timeout_ms,
            &f("http_timeout_ms"),
            1..=600_000,
            defaults::HTTP_TIMEOUT_MS,
        )?),
        max_response_bytes: cx.int(
            &p.http_max_response_bytes,
            &f("http_max_response_bytes"),
            1..=(1 << 30),
            defaults::HTTP_MAX_RESPONSE_BYTES,
        )?,
        max_concurrent: cx.int(
            &p.http_max_concurrent,
            &f("http_max_concurrent"),
            1..=1024,
            defaults::HTTP_MAX_CONCURRENT,
        )?,
        ca_file: p.http_ca_file.as_ref().map(|c| cx.path(c)),
    };
    // The grant's own checks (every entry, the CA file), at the list's span.
    HttpGrant::new(settings.clone()).map_err(|e| {
        cx.err(
            Some(hosts.span()),
            f("allowed_outbound_hosts"),
            e.to_string(),
        )
    })?;
    Ok(Some(settings))
}
