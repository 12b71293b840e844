//! `[pipeline.schema]`: records in the schema registry's wire format, decoded for the plugin,
//! and emits encoded with their output's schema (see [`crate::schema`]).
//!
//! ```toml
//! [pipeline.schema]
//! registry = "http://127.0.0.1:18081/apis/ccompat/v7"   # the Confluent-compatible API
//! value = "avro"              # avro | json-schema | raw (the default)
//! key = "raw"
//! username = "svc"            # basic auth, with `password`; or `token` for a bearer token
//! password = { env = "REGISTRY_PASSWORD" }
//! [pipeline.schema.outputs]
//! scored = "avro"             # encoded with subject `<topic>-value`'s latest schema
//! ```
//!
//! The credentials are read like `[pipeline.secrets]` (an environment variable or a file, never
//! a value in the manifest) but are the host's alone: they are never handed to the plugin.

use std::collections::BTreeMap;

use super::context::Ctx;
use super::error::ManifestError;
use super::grants::secret_source;
use super::raw::{RawPipeline, RawSchema};
use super::secret::SecretSource;
use crate::schema::{Format, RegistryAuth, SchemaSettings};

/// How the host signs in to the registry, its secrets still unread.
#[derive(Debug, Clone, PartialEq)]
pub enum SchemaAuthSpec {
    /// Basic: a user name and where its password is read from.
    Basic {
        /// The user name.
        username: String,
        /// Where the password is read from.
        password: SecretSource,
    },
    /// Where a bearer token is read from.
    Bearer(SecretSource),
}

/// A pipeline's `[pipeline.schema]`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaSpec {
    /// The registry and the formats.
    pub settings: SchemaSettings,
    /// The credentials, if any.
    pub auth: Option<SchemaAuthSpec>,
}

impl SchemaSpec {
    /// Reads the credentials; errors name the key and the variable or file, never a value.
    pub fn resolve_auth(&self, pipeline: &str) -> Result<Option<RegistryAuth>, String> {
        let field = |k: &str| format!("pipeline {pipeline}: schema.{k}");
        Ok(match &self.auth {
            None => None,
            Some(SchemaAuthSpec::Basic { username, password }) => Some(RegistryAuth::Basic {
                username: username.clone(),
                password: password.read(&field("password"))?,
            }),
            Some(SchemaAuthSpec::Bearer(token)) => {
                Some(RegistryAuth::Bearer(token.read(&field("token"))?))
            }
        })
    }
}

fn format(
    cx: &Ctx<'_>,
    v: &Option<toml::Spanned<String>>,
    field: &str,
) -> Result<Format, ManifestError> {
    cx.choice(
        v,
        field,
        &[
            ("raw", Format::Raw),
            ("avro", Format::Avro),
            ("protobuf", Format::Protobuf),
            ("json-schema", Format::JsonSchema),
        ],
        Format::Raw,
    )
}

/// Checks `[pipeline.schema]` against the pipeline's outputs.
pub(super) fn schema(
    cx: &Ctx<'_>,
    p: &RawPipeline,
    field: &str,
    outputs: &BTreeMap<String, String>,
) -> Result<Option<SchemaSpec>, ManifestError> {
    let Some(raw) = &p.schema else {
        return Ok(None);
    };
    let span = raw.span();
    let raw: &RawSchema = raw.get_ref();
    let f = |k: &str| format!("{field}.schema.{k}");
    let registry = raw.registry.get_ref().trim_end_matches('/').to_owned();
    let ca_file = raw.ca_file.as_ref().map(|c| cx.path(c));
    let mut out_formats = BTreeMap::new();
    for (name, fmt) in &raw.outputs {
        let key = f(&format!("outputs.{name}"));
        if !outputs.contains_key(name) {
            return Err(cx.err(
                Some(fmt.span()),
                key,
                format!("{name:?} is not one of [pipeline.outputs]"),
            ));
        }
        out_formats.insert(name.clone(), format(cx, &Some(fmt.clone()), &key)?);
    }
    let settings = SchemaSettings {
        registry,
        value: format(cx, &raw.value, &f("value"))?,
        key: format(cx, &raw.key, &f("key"))?,
        outputs: out_formats,
        ca_file,
    };
    // The client's own checks (the URL, the TLS roots), at the registry's span.
    crate::schema::Registry::new(&settings.registry, None, settings.ca_file.as_deref())
        .map_err(|e| cx.err(Some(raw.registry.span()), f("registry"), e.to_string()))?;
    let auth = match (&raw.username, &raw.password, &raw.token) {
        (None, None, None) => None,
        (Some(u), Some(pw), None) => Some(SchemaAuthSpec::Basic {
            username: u.get_ref().clone(),
            password: secret_source(cx, pw, f("password"))?,
        }),
        (None, None, Some(t)) => Some(SchemaAuthSpec::Bearer(secret_source(cx, t, f("token"))?)),
        _ => {
            return Err(cx.err(
                Some(span),
                f("username"),
                "set username with password (basic), or token (bearer), or none of them",
            ));
        }
    };
    Ok(Some(SchemaSpec { settings, auth }))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{MINIMAL, parse};
    use crate::schema::Format;

    #[test]
    fn a_schema_table_is_checked_against_the_outputs_and_its_credentials() {
        let with = |extra: &str| {
            parse(&format!(
                "{MINIMAL}[pipeline.outputs]\nscored = \"orders-scored\"\n[pipeline.schema]\n{extra}"
            ))
        };
        let m = with("registry = \"http://127.0.0.1:18081/apis/ccompat/v7/\"\nvalue = \"avro\"\n[pipeline.schema.outputs]\nscored = \"avro\"\n")
            .expect("valid");
        let s = m.pipelines[0].schema.as_ref().expect("a schema");
        assert_eq!(
            s.settings.registry,
            "http://127.0.0.1:18081/apis/ccompat/v7"
        );
        assert_eq!(
            (s.settings.value, s.settings.key),
            (Format::Avro, Format::Raw)
        );
        assert_eq!(s.settings.outputs["scored"], Format::Avro);
        let e = with("registry = \"http://r\"\n[pipeline.schema.outputs]\nother = \"avro\"\n")
            .expect_err("not an output")
            .to_string();
        assert!(e.contains("schema.outputs.other"), "{e}");
        let e = with("registry = \"http://r\"\nvalue = \"thrift\"\n")
            .expect_err("not a format")
            .to_string();
        assert!(e.contains("schema.value"), "{e}");
        let e = with("registry = \"ftp://r\"\n")
            .expect_err("not http")
            .to_string();
        assert!(e.contains("schema.registry"), "{e}");
        let e = with("registry = \"http://r\"\nusername = \"u\"\n")
            .expect_err("no password")
            .to_string();
        assert!(e.contains("password"), "{e}");
        let e = with("registry = \"http://r\"\ntoken = \"t0ken-in-the-manifest\"\n")
            .expect_err("a value, not a source")
            .to_string();
        assert!(!e.contains("t0ken-in-the-manifest"), "never quoted: {e}");
    }
}
