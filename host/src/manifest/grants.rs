//! What a pipeline grants its plugin beyond its records: the topics it may emit to
//! (`[pipeline.outputs]` and the emit limits), the secrets handed to `init`
//! (`[pipeline.secrets]`), and outbound HTTP (`allowed_outbound_hosts` and the `http_*` keys).
//! The manifest grants; the runtime enforces.

use std::collections::BTreeMap;
use std::time::Duration;

use toml::Spanned;

use super::PipelineSpec;
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
        secrets.push((secret.clone(), secret_source(cx, source, field)?));
    }
    Ok(secrets)
}

/// Where one secret is read from: exactly one of `{ env = "VAR" }` or `{ file = "path" }`. A
/// value written in its place is refused without being quoted.
pub(super) fn secret_source(
    cx: &Ctx<'_>,
    source: &Spanned<toml::Value>,
    field: String,
) -> Result<SecretSource, ManifestError> {
    let table = source.get_ref().as_table();
    let key = |k: &str| table.and_then(|t| t.get(k)).and_then(toml::Value::as_str);
    let only = table.is_some_and(|t| t.len() == 1);
    match (key("env"), key("file")) {
        (Some(var), None) if only && !var.is_empty() => Ok(SecretSource::Env(var.to_owned())),
        (None, Some(file)) if only && !file.is_empty() => Ok(SecretSource::File(
            cx.path(&Spanned::new(source.span(), file.to_owned())),
        )),
        _ => Err(cx.err(
            Some(source.span()),
            field,
            "set exactly one of { env = \"VAR\" } or { file = \"path\" } (secrets never go in the manifest)",
        )),
    }
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

/// See [`super::PipelineSpec::grants_widened_from`].
pub(super) fn widened(before: Option<&PipelineSpec>, after: &PipelineSpec) -> Vec<String> {
    let mut out = Vec::new();
    for (name, topic) in &after.outputs {
        match before.and_then(|b| b.outputs.get(name)) {
            Some(t) if t == topic => {}
            Some(t) => out.push(format!(
                "output {name} now writes to topic {topic} (was {t})"
            )),
            None => out.push(format!("output {name} (topic {topic}) added")),
        }
    }
    let hosts = |p: Option<&PipelineSpec>| -> Vec<String> {
        p.and_then(|p| p.http.as_ref())
            .map(|h| h.allowed_outbound_hosts.clone())
            .unwrap_or_default()
    };
    let had = hosts(before);
    let added: Vec<String> = hosts(Some(after))
        .into_iter()
        .filter(|h| !had.contains(h))
        .collect();
    if !added.is_empty() {
        out.push(format!("outbound hosts added: {}", added.join(", ")));
    }
    for (name, source) in &after.secrets {
        let old = before.and_then(|b| b.secrets.iter().find(|(n, _)| n == name));
        match old {
            Some((_, s)) if s == source => {}
            Some(_) => out.push(format!("secret {name} now read from another source")),
            None => out.push(format!("secret {name} added")),
        }
    }
    if before.is_some_and(|b| b.trust.is_some()) && after.trust.is_none() {
        out.push("its components no longer need a signature ([trust] dropped)".into());
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::manifest::defaults;
    use crate::manifest::testing::{MINIMAL, parse};

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
    fn widened_grants_are_named_and_narrowing_is_not() {
        let before = format!(
            "{MINIMAL}allowed_outbound_hosts = [\"http://a.example\"]\n[pipeline.outputs]\nvalid = \"orders-valid\"\n"
        );
        let after = format!(
            "{MINIMAL}allowed_outbound_hosts = [\"http://a.example\", \"http://b.example\"]\n[pipeline.outputs]\nvalid = \"other\"\nextra = \"orders-extra\"\n[pipeline.secrets]\nt = {{ env = \"T\" }}\n"
        );
        let b = parse(&before).expect("before").pipelines.remove(0);
        let a = parse(&after).expect("after").pipelines.remove(0);
        assert_eq!(
            a.grants_widened_from(Some(&b)),
            [
                "output extra (topic orders-extra) added",
                "output valid now writes to topic other (was orders-valid)",
                "outbound hosts added: http://b.example",
                "secret t added",
            ]
        );
        // Going back drops hosts, outputs and a secret (not named); pointing an output at
        // another topic is a new grant whichever way it goes.
        assert_eq!(
            b.grants_widened_from(Some(&a)),
            ["output valid now writes to topic orders-valid (was other)"],
            "narrowing"
        );
        assert!(b.grants_widened_from(Some(&b)).is_empty(), "unchanged");
        assert_eq!(
            b.grants_widened_from(None).len(),
            2,
            "a new pipeline's grants"
        );
    }
}
