//! `sharehost probe`: the cluster reached the way a pipeline reaches it, and what it offers.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use kafka_protocol::messages::ApiKey;
use sharehost::kafka::{
    ConnectionConfig, KafkaClient, Mechanism, SaslSettings, Secret, TlsSettings,
};

/// How to reach a cluster from the command line.
#[derive(Args)]
pub(crate) struct ClusterArgs {
    /// Comma-separated bootstrap list, e.g. 127.0.0.1:9092.
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    /// Use TLS (with the system roots unless --tls-ca is given).
    #[arg(long)]
    tls: bool,
    /// PEM file of CA certificates to trust (implies --tls).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Verify the broker certificate against this name instead of the broker's host.
    #[arg(long)]
    tls_server_name: Option<String>,
    /// SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    #[arg(long)]
    sasl_mechanism: Option<Mechanism>,
    /// SASL user name.
    #[arg(long)]
    sasl_username: Option<String>,
    /// Name of the environment variable holding the SASL password (never pass secrets as
    /// arguments: they show up in process listings).
    #[arg(long, default_value = "SHAREHOST_SASL_PASSWORD")]
    sasl_password_env: String,
}

#[derive(Args)]
pub(crate) struct ProbeArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
}

impl ClusterArgs {
    /// The bootstrap list given.
    pub(crate) fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The connection the flags describe (TLS, SASL with the password from the environment).
    pub(crate) fn connection_config(&self) -> Result<ConnectionConfig> {
        let mut config = ConnectionConfig::new("sharehost");
        if self.tls || self.tls_ca.is_some() {
            config = config.with_tls(&TlsSettings {
                ca_file: self.tls_ca.clone(),
                server_name: self.tls_server_name.clone(),
                ..Default::default()
            })?;
        }
        if let Some(mechanism) = self.sasl_mechanism {
            let username = self
                .sasl_username
                .clone()
                .context("--sasl-mechanism needs --sasl-username")?;
            let password = std::env::var(&self.sasl_password_env).with_context(|| {
                format!(
                    "SASL password: environment variable {} is not set",
                    self.sasl_password_env
                )
            })?;
            config = config.with_sasl(SaslSettings {
                mechanism,
                username,
                password: Secret::new(password),
            });
        }
        Ok(config)
    }
}

pub(crate) async fn run(args: ProbeArgs) -> Result<()> {
    let config = args.cluster.connection_config()?;
    let client = KafkaClient::connect(&args.cluster.bootstrap, config).await?;
    for id in client.broker_ids() {
        let conn = client.connection(id).await?;
        let show = |api: ApiKey| match conn.versions().range(api) {
            Some(r) => format!("{api:?} {r}"),
            None => format!("{api:?} -"),
        };
        println!(
            "{}: {}, {}, {}, {}",
            conn.broker(),
            show(ApiKey::ShareGroupHeartbeat),
            show(ApiKey::ShareFetch),
            show(ApiKey::ShareAcknowledge),
            show(ApiKey::FindCoordinator),
        );
    }
    Ok(())
}
