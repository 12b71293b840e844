//! `[cluster]`: how to reach the brokers ([`ClusterSpec`]), and its validator. The bootstrap
//! list is checked by the wire layer's own parser, TLS files must exist, and the SASL password
//! is named by where it lives, read only when a connection is configured.

use std::path::PathBuf;

use toml::Spanned;

use super::context::Ctx;
use super::defaults;
use super::error::ManifestError;
use super::raw::{RawCluster, RawSasl, RawTls};
use super::secret::SecretSource;
use crate::kafka::{
    ConnectionConfig, Mechanism, SaslSettings, Secret, TlsSettings, parse_bootstrap,
};

/// SASL settings as written; the secret is read by [`ClusterSpec::sasl_settings`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslSpec {
    /// Mechanism.
    pub mechanism: Mechanism,
    /// User name.
    pub username: String,
    /// Where the password is.
    pub password: SecretSource,
}

/// How to reach the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Bootstrap list as written (already validated).
    pub bootstrap: String,
    /// Client id sent to the brokers.
    pub client_id: String,
    /// TLS settings (paths resolved against the manifest's folder).
    pub tls: Option<TlsSettings>,
    /// SASL settings.
    pub sasl: Option<SaslSpec>,
}

impl ClusterSpec {
    /// The connection settings every broker connection of the host uses (client id, TLS, SASL
    /// with its secret read now), built in one place for `sharehost run` and the benchmark host.
    pub fn connection_config(&self) -> Result<ConnectionConfig, String> {
        let mut config = ConnectionConfig::new(self.client_id.clone());
        if let Some(tls) = &self.tls {
            config = config.with_tls(tls).map_err(|e| e.to_string())?;
        }
        if let Some(sasl) = self.sasl_settings()? {
            config = config.with_sasl(sasl);
        }
        Ok(config)
    }

    /// Reads the SASL secret from its environment variable or file.
    pub fn sasl_settings(&self) -> Result<Option<SaslSettings>, String> {
        let Some(s) = &self.sasl else { return Ok(None) };
        let field = match &s.password {
            SecretSource::Env(_) => "cluster.sasl.password_env",
            SecretSource::File(_) => "cluster.sasl.password_file",
        };
        let password = s.password.read(field)?;
        Ok(Some(SaslSettings {
            mechanism: s.mechanism,
            username: s.username.clone(),
            password: Secret::new(password),
        }))
    }
}

/// Validates `[cluster]`: the bootstrap list, then `tls`, then `sasl`.
pub(super) fn validate(cx: &Ctx<'_>, c: &RawCluster) -> Result<ClusterSpec, ManifestError> {
    parse_bootstrap(c.bootstrap.get_ref())
        .map_err(|e| cx.err(Some(c.bootstrap.span()), "cluster.bootstrap", e.to_string()))?;
    let tls = c.tls.as_ref().map(|t| tls(cx, t)).transpose()?;
    let sasl = c.sasl.as_ref().map(|s| sasl(cx, s)).transpose()?;
    Ok(ClusterSpec {
        bootstrap: c.bootstrap.get_ref().clone(),
        client_id: c
            .client_id
            .clone()
            .unwrap_or_else(|| defaults::CLIENT_ID.to_owned()),
        tls,
        sasl,
    })
}

/// `[cluster.tls]`: each file named must exist; a client certificate comes with its key.
fn tls(cx: &Ctx<'_>, t: &RawTls) -> Result<TlsSettings, ManifestError> {
    let file =
        |v: &Option<Spanned<String>>, field: &str| -> Result<Option<PathBuf>, ManifestError> {
            let Some(v) = v else { return Ok(None) };
            let p = cx.path(v);
            if !p.is_file() {
                return Err(cx.err(
                    Some(v.span()),
                    field,
                    format!("file {} does not exist", p.display()),
                ));
            }
            Ok(Some(p))
        };
    let settings = TlsSettings {
        ca_file: file(&t.ca_file, "cluster.tls.ca_file")?,
        cert_file: file(&t.cert_file, "cluster.tls.cert_file")?,
        key_file: file(&t.key_file, "cluster.tls.key_file")?,
        server_name: t.server_name.clone(),
    };
    if settings.cert_file.is_some() != settings.key_file.is_some() {
        return Err(cx.err(None, "cluster.tls", "cert_file and key_file go together"));
    }
    Ok(settings)
}

/// `[cluster.sasl]`: a known mechanism, a user name, and exactly one place for the password.
fn sasl(cx: &Ctx<'_>, raw: &Spanned<RawSasl>) -> Result<SaslSpec, ManifestError> {
    let s = raw.get_ref();
    let mechanism: Mechanism = s
        .mechanism
        .get_ref()
        .parse()
        .map_err(|e: String| cx.err(Some(s.mechanism.span()), "cluster.sasl.mechanism", e))?;
    if s.username.get_ref().is_empty() {
        return Err(cx.err(
            Some(s.username.span()),
            "cluster.sasl.username",
            "must not be empty",
        ));
    }
    let password = match (&s.password_env, &s.password_file) {
        (Some(e), None) if !e.get_ref().is_empty() => SecretSource::Env(e.get_ref().clone()),
        (None, Some(f)) => SecretSource::File(cx.path(f)),
        _ => {
            return Err(cx.err(
                Some(raw.span()),
                "cluster.sasl",
                "set exactly one of password_env or password_file (secrets never go in the manifest)",
            ));
        }
    };
    Ok(SaslSpec {
        mechanism,
        username: s.username.get_ref().clone(),
        password,
    })
}

#[cfg(test)]
mod tests {
    use crate::manifest::testing::{MINIMAL, parse};

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
