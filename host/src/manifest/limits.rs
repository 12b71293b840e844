//! Bounds on what a manifest may ask of a host, checked on the TOML shape before any table is
//! validated (before a component, key or secret file is opened), so a manifest that asks for
//! too much is refused at the cost of parsing it, at start, in `check` and on a live re-read
//! alike, and the refusal names the bound.
//!
//! The bounds are fixed, not settings: each is far above what a host is for (see why at each),
//! and a manifest that needs more is better split over more hosts than run by one.

use super::context::Ctx;
use super::error::ManifestError;
use super::raw::{RawManifest, RawTrust};

/// The largest manifest file read, in bytes: [`MAX_PIPELINES`] pipelines of 16 KiB each
/// (a pipeline with every key, a page of config and the most hosts and outputs is about
/// 4 KiB), so no manifest that passes the bounds below is refused for its size, and a file
/// replaced by `/dev/zero` or a log costs at most this much memory.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// The largest secret file (`{ file = ... }`, `password_file`), in bytes: a secret is a token,
/// a password or a PEM key of a few KiB; 1 MiB leaves room for a certificate chain and still
/// bounds what a path to `/dev/zero` or a large file costs.
pub const MAX_SECRET_BYTES: u64 = 1 << 20;

/// Pipelines per host. Each is a share-group member with its own fetches, at least one plugin
/// instance (and three per unit of concurrency reserved for swaps and canaries) and its own
/// task; a few dozen is a large host, and a manifest of thousands (one reload asked for 10,002
/// and took gigabytes) is a mistake or an attack, not a deployment.
pub const MAX_PIPELINES: usize = 256;

/// Topics one pipeline consumes: a share group subscribes by name, and a list this long is
/// already one that a pattern or several pipelines would state better.
pub const MAX_TOPICS: usize = 256;

/// Entries of one pipeline's `config` (handed to the plugin's `init` as a list; a plugin reads
/// a handful).
pub const MAX_CONFIG_ENTRIES: usize = 256;

/// Outputs, secrets and outbound hosts one pipeline grants, each: a grant is read by a person
/// reviewing the manifest, and a list longer than this is not reviewed.
pub const MAX_GRANTS: usize = 64;

/// Trusted keys inline in one `[trust]` table (a keys file is bounded by its size, 64 KiB).
pub const MAX_TRUSTED_KEYS: usize = 256;

/// Refuses a manifest that asks for more than a bound, naming the first bound passed and
/// pointing at the first entry past it when it has a position.
pub(super) fn check(cx: &Ctx<'_>, raw: &RawManifest) -> Result<(), ManifestError> {
    let over = |span: Option<std::ops::Range<usize>>,
                field: String,
                n: usize,
                what: &str,
                max: usize,
                why: &str| {
        cx.err(
            span,
            field,
            format!("{n} {what}, more than the {max} allowed ({why})"),
        )
    };
    let n = raw.pipelines.len();
    if n > MAX_PIPELINES {
        return Err(over(
            raw.pipelines.get(MAX_PIPELINES).map(|p| p.name.span()),
            "pipeline".into(),
            n,
            "pipelines",
            MAX_PIPELINES,
            "a fixed bound per host: run more hosts",
        ));
    }
    if let Some(t) = &raw.trust {
        trust(cx, t.get_ref(), "trust")?;
    }
    for (i, p) in raw.pipelines.iter().enumerate() {
        let field = |key: &str| format!("pipeline[{i}].{key}");
        let topics = p.topics.get_ref().len();
        if topics > MAX_TOPICS {
            return Err(over(
                Some(p.topics.span()),
                field("topics"),
                topics,
                "topics",
                MAX_TOPICS,
                "a fixed bound per pipeline",
            ));
        }
        if p.config.len() > MAX_CONFIG_ENTRIES {
            return Err(over(
                None,
                field("config"),
                p.config.len(),
                "entries",
                MAX_CONFIG_ENTRIES,
                "a fixed bound per pipeline",
            ));
        }
        // An empty key is no entry a plugin can ask for by name (and `--config =x` is
        // refused the same way).
        if p.config.contains_key("") {
            return Err(cx.err(
                None,
                field("config"),
                "a key is empty (\"\" = ...): every entry needs a name",
            ));
        }
        if p.outputs.len() > MAX_GRANTS {
            return Err(over(
                p.outputs.values().nth(MAX_GRANTS).map(|v| v.span()),
                field("outputs"),
                p.outputs.len(),
                "outputs",
                MAX_GRANTS,
                "a fixed bound per pipeline",
            ));
        }
        if p.secrets.len() > MAX_GRANTS {
            return Err(over(
                p.secrets.values().nth(MAX_GRANTS).map(|v| v.span()),
                field("secrets"),
                p.secrets.len(),
                "secrets",
                MAX_GRANTS,
                "a fixed bound per pipeline",
            ));
        }
        if let Some(hosts) = &p.allowed_outbound_hosts
            && hosts.get_ref().len() > MAX_GRANTS
        {
            return Err(over(
                Some(hosts.span()),
                field("allowed_outbound_hosts"),
                hosts.get_ref().len(),
                "hosts",
                MAX_GRANTS,
                "a fixed bound per pipeline",
            ));
        }
        if let Some(t) = &p.trust {
            trust(cx, t.get_ref(), &field("trust"))?;
        }
    }
    Ok(())
}

/// A trust table's inline keys, at most [`MAX_TRUSTED_KEYS`].
fn trust(cx: &Ctx<'_>, t: &RawTrust, field: &str) -> Result<(), ManifestError> {
    match &t.keys {
        Some(keys) if keys.get_ref().len() > MAX_TRUSTED_KEYS => Err(cx.err(
            Some(keys.span()),
            format!("{field}.keys"),
            format!(
                "{} keys, more than the {MAX_TRUSTED_KEYS} allowed (a fixed bound per table)",
                keys.get_ref().len()
            ),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::testing::{MINIMAL, dir, parse};

    #[test]
    fn a_manifest_of_too_many_pipelines_is_refused_naming_the_bound_before_any_is_read() {
        // The component path does not exist: the bound is checked before any pipeline is.
        let one = |i: usize| {
            format!(
                "[[pipeline]]\nname = \"p{i}\"\ntopics = [\"t{i}\"]\ngroup = \"g{i}\"\ncomponent = \"absent.wasm\"\n"
            )
        };
        let mut text = String::from("[cluster]\nbootstrap = \"localhost:9092\"\n");
        for i in 0..=MAX_PIPELINES {
            text.push_str(&one(i));
        }
        let e = parse(&text).expect_err("too many");
        assert_eq!(e.field.as_deref(), Some("pipeline"), "{e}");
        assert!(
            e.message.starts_with(&format!(
                "{} pipelines, more than the {MAX_PIPELINES} allowed",
                MAX_PIPELINES + 1
            )),
            "{e}"
        );
        assert!(e.line.is_some(), "{e}");
        assert!(e.file.starts_with(dir()), "{e}");
    }

    #[test]
    fn grants_and_config_past_their_bound_are_refused_naming_the_key() {
        let many = |f: &dyn Fn(usize) -> String, n: usize| (0..n).map(f).collect::<String>();
        for (extra, key) in [
            (
                format!(
                    "[pipeline.outputs]\n{}",
                    many(&|i| format!("o{i} = \"out{i}\"\n"), MAX_GRANTS + 1)
                ),
                "pipeline[0].outputs",
            ),
            (
                format!(
                    "[pipeline.secrets]\n{}",
                    many(
                        &|i| format!("s{i} = {{ env = \"V{i}\" }}\n"),
                        MAX_GRANTS + 1
                    )
                ),
                "pipeline[0].secrets",
            ),
            (
                format!(
                    "allowed_outbound_hosts = [{}]\n",
                    many(&|i| format!("\"http://h{i}.example\","), MAX_GRANTS + 1)
                ),
                "pipeline[0].allowed_outbound_hosts",
            ),
        ] {
            let e = parse(&format!("{MINIMAL}{extra}")).expect_err(key);
            assert_eq!(e.field.as_deref(), Some(key), "{e}");
            assert!(
                e.message
                    .contains(&format!("more than the {MAX_GRANTS} allowed")),
                "{e}"
            );
        }
        let config = many(&|i| format!("k{i} = \"v\", "), MAX_CONFIG_ENTRIES + 1);
        let text = MINIMAL.replace(
            "group = \"orders-g\"",
            &format!(
                "group = \"orders-g\"\nconfig = {{ {} }}",
                config.trim_end_matches(", ")
            ),
        );
        let e = parse(&text).expect_err("config");
        assert_eq!(e.field.as_deref(), Some("pipeline[0].config"), "{e}");
        assert!(
            e.message
                .contains(&format!("more than the {MAX_CONFIG_ENTRIES} allowed")),
            "{e}"
        );
        let text = MINIMAL.replace(
            "group = \"orders-g\"",
            "group = \"orders-g\"\nconfig = { \"\" = \"x\" }",
        );
        let e = parse(&text).expect_err("empty key");
        assert_eq!(e.field.as_deref(), Some("pipeline[0].config"), "{e}");
        assert!(e.message.contains("a key is empty"), "{e}");
        // At the bound: accepted.
        let at = format!(
            "{MINIMAL}[pipeline.outputs]\n{}",
            many(&|i| format!("o{i} = \"out{i}\"\n"), MAX_GRANTS)
        );
        parse(&at).expect("at the bound");
    }
}
