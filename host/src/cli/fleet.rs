//! `sharehost fleet`: an operator's commands for a fleet of hosts. Each records one signed
//! action in the fleet's deployments topic; every host of the fleet applies it. `status` reads
//! what every host reports.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use sharehost::fleet::operator::Operator;
use sharehost::fleet::records::{CanaryRules, Change, ComponentRef};
use sharehost::fleet::sign::load_key;
use sharehost::kafka::KafkaClient;
use sharehost::manifest::Manifest;
use sharehost::metrics::Metrics;
use sharehost::pipeline::{Pipeline, short};
use sharehost::rollout::{CanaryRequest, PromoteAfter, RollbackIf, ShadowRequest};
use sharehost_api::FleetView;

use super::run::{connection_config, plugin_runtime};

/// `sharehost fleet COMMAND`.
#[derive(Args)]
pub struct FleetArgs {
    #[command(subcommand)]
    command: FleetCommand,
}

/// Which pipeline of which fleet, and the key that signs the action.
#[derive(Args)]
struct Target {
    /// A manifest of one of the fleet's hosts (its [fleet], [cluster] and the pipeline's
    /// trusted keys are used).
    manifest: PathBuf,
    /// The pipeline.
    #[arg(long)]
    pipeline: String,
    /// The minisign secret key that signs the action (`minisign -G`); its public key must be
    /// in the hosts' [trust]. An encrypted key's password is read from
    /// SHAREHOST_SIGNING_KEY_PASSWORD.
    #[arg(long)]
    key: PathBuf,
}

#[derive(Subcommand)]
enum FleetCommand {
    /// Make COMPONENT (signed: COMPONENT.minisig beside it) the active version of the
    /// pipeline on every host of the fleet.
    Deploy {
        #[command(flatten)]
        target: Target,
        /// The component (.wasm).
        component: PathBuf,
    },
    /// Go back to the version before the active one, or to the one whose digest starts with
    /// TO.
    Rollback {
        #[command(flatten)]
        target: Target,
        /// A digest prefix (see `fleet status`).
        to: Option<String>,
    },
    /// Judge copies of a sample of batches with COMPONENT on every host (never acted on).
    Shadow {
        #[command(flatten)]
        target: Target,
        /// The candidate (.wasm, signed).
        component: PathBuf,
        /// Fraction of batches copied to it (0 < sample ≤ 1).
        #[arg(long, default_value_t = 1.0)]
        sample: f64,
    },
    /// Stop the fleet's shadow of the pipeline.
    StopShadow {
        #[command(flatten)]
        target: Target,
    },
    /// Let COMPONENT judge a share of batches for real on every host; promoted or rolled back
    /// on the sum of every host's tallies.
    Canary {
        #[command(flatten)]
        target: Target,
        /// The candidate (.wasm, signed).
        component: PathBuf,
        /// Share of batches it judges on every host (0 < percent ≤ 100).
        #[arg(long)]
        percent: f64,
        /// Promote after this many candidate batches over the fleet.
        #[arg(long)]
        promote_after_batches: Option<u64>,
        /// Promote after this many seconds from now.
        #[arg(long)]
        promote_after_seconds: Option<u64>,
        /// Largest share of the candidate's batches that may fault over the fleet (0: any
        /// fault rolls it back).
        #[arg(long, default_value_t = 0.0)]
        max_fault_rate: f64,
        /// Largest increase of its reject rate over the active version's, in rate points.
        #[arg(long, default_value_t = 0.05)]
        max_reject_rate_increase: f64,
        /// Largest increase of its release rate over the active version's, in rate points.
        #[arg(long, default_value_t = 0.05)]
        max_release_rate_increase: f64,
    },
    /// Promote the running fleet canary now.
    Promote {
        #[command(flatten)]
        target: Target,
    },
    /// Roll the running fleet canary back now.
    Abort {
        #[command(flatten)]
        target: Target,
    },
    /// Make an operator's key pair: DIR/operator.key (the secret key, 0600; encrypted with
    /// SHAREHOST_SIGNING_KEY_PASSWORD when it is set) and DIR/operator.pub, as `minisign -G`
    /// does; prints the line a host's [trust] lists.
    Keygen {
        /// Where to write the two files (made if missing; existing files are not replaced).
        dir: PathBuf,
    },
    /// Sign COMPONENT with a secret key: writes COMPONENT.minisig, as `minisign -Sm` does.
    Sign {
        /// The component (.wasm).
        component: PathBuf,
        /// The minisign secret key.
        #[arg(long)]
        key: PathBuf,
    },
    /// Every host, its pipelines, versions, rollout state and the fleet's tallies.
    Status {
        /// A manifest of one of the fleet's hosts.
        manifest: PathBuf,
        /// Print the fleet as JSON (the shape of `GET /fleet`).
        #[arg(long)]
        json: bool,
    },
}

/// Opens the fleet of `manifest`.
async fn open(manifest: &Manifest) -> Result<Operator> {
    let client = KafkaClient::connect(&manifest.cluster.bootstrap, connection_config(manifest)?)
        .await
        .with_context(|| format!("cluster {}", manifest.cluster.bootstrap))?;
    Operator::open(manifest, Arc::new(client))
        .await
        .context("reading the fleet's state from its topics")
}

/// Loads `component` as the pipeline's hosts will (world, limits, grants, init with its
/// config), so a component no host could run is refused before it is uploaded.
async fn check_component(manifest: &Manifest, pipeline: &str, component: &Path) -> Result<()> {
    let mut spec = Operator::pipeline(manifest, pipeline)?.clone();
    spec.component = component.to_owned();
    let runtime = plugin_runtime(manifest)?;
    Pipeline::load(spec, runtime, Arc::new(Metrics::new()))
        .await
        .with_context(|| format!("{}: refused before upload", component.display()))?;
    Ok(())
}

/// Uploads a checked component (once per digest) and says how an action names it.
async fn upload(
    op: &Operator,
    manifest: &Manifest,
    pipeline: &str,
    component: &Path,
) -> Result<ComponentRef> {
    check_component(manifest, pipeline, component).await?;
    let spec = Operator::pipeline(manifest, pipeline)?;
    Ok(op.component(spec, component).await?)
}

/// Runs `sharehost fleet ...`.
pub async fn run(args: FleetArgs) -> Result<()> {
    let target = match &args.command {
        FleetCommand::Keygen { dir } => return keygen(dir),
        FleetCommand::Sign { component, key } => return sign_component(component, key),
        FleetCommand::Status { manifest, json } => {
            let manifest = Manifest::load(manifest)?;
            let view = open(&manifest).await?.view();
            if *json {
                println!("{}", serde_json::to_string_pretty(&view)?);
            } else {
                print!("{}", render(&view));
            }
            return Ok(());
        }
        FleetCommand::Deploy { target, .. }
        | FleetCommand::Rollback { target, .. }
        | FleetCommand::Shadow { target, .. }
        | FleetCommand::StopShadow { target }
        | FleetCommand::Canary { target, .. }
        | FleetCommand::Promote { target }
        | FleetCommand::Abort { target } => target,
    };
    let manifest = Manifest::load(&target.manifest)?;
    Operator::pipeline(&manifest, &target.pipeline)?;
    let key = load_key(&target.key)?;
    let op = open(&manifest).await?;
    let pipeline = target.pipeline.as_str();
    let change = match &args.command {
        FleetCommand::Deploy { component, .. } => Change::Deploy {
            component: upload(&op, &manifest, pipeline, component).await?,
        },
        FleetCommand::Rollback { to, .. } => Change::Rollback { to: to.clone() },
        FleetCommand::Shadow {
            component, sample, ..
        } => {
            ShadowRequest {
                path: component.clone(),
                sample: *sample,
            }
            .validate()
            .map_err(anyhow::Error::msg)?;
            Change::Shadow {
                component: upload(&op, &manifest, pipeline, component).await?,
                sample: *sample,
            }
        }
        FleetCommand::StopShadow { .. } => Change::StopShadow,
        FleetCommand::Canary {
            component,
            percent,
            promote_after_batches,
            promote_after_seconds,
            max_fault_rate,
            max_reject_rate_increase,
            max_release_rate_increase,
            ..
        } => {
            let rules = CanaryRules {
                percent: *percent,
                promote_after: PromoteAfter {
                    batches: *promote_after_batches,
                    seconds: *promote_after_seconds,
                },
                rollback_if: RollbackIf {
                    max_fault_rate: *max_fault_rate,
                    max_reject_rate_increase: *max_reject_rate_increase,
                    max_release_rate_increase: *max_release_rate_increase,
                },
            };
            CanaryRequest {
                path: component.clone(),
                percent: rules.percent,
                promote_after: rules.promote_after.clone(),
                rollback_if: rules.rollback_if.clone(),
            }
            .validate()
            .map_err(anyhow::Error::msg)?;
            Change::Canary {
                component: upload(&op, &manifest, pipeline, component).await?,
                rules,
            }
        }
        FleetCommand::Promote { .. } => Change::Promote,
        FleetCommand::Abort { .. } => Change::AbortCanary,
        FleetCommand::Status { .. } | FleetCommand::Keygen { .. } | FleetCommand::Sign { .. } => {
            bail!("unreachable: answered above")
        }
    };
    let what = match &change {
        Change::Deploy { component }
        | Change::Shadow { component, .. }
        | Change::Canary { component, .. } => format!(" of {}", short(&component.digest)),
        Change::Rollback { to: Some(to) } => format!(" to {to}"),
        _ => String::new(),
    };
    let action = op
        .act(pipeline, change, &key)
        .await
        .context("recording the action in the fleet's deployments topic")?;
    println!(
        "fleet {}: pipeline {}: action {} ({}{what}) recorded; every host applies it",
        action.fleet,
        action.pipeline,
        action.seq,
        action.change.name()
    );
    Ok(())
}

/// `sharehost fleet keygen DIR`.
fn keygen(dir: &Path) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let password = std::env::var(sharehost::fleet::sign::KEY_PASSWORD_ENV).ok();
    let kp = match password {
        Some(p) => minisign::KeyPair::generate_encrypted_keypair(Some(p)),
        None => minisign::KeyPair::generate_unencrypted_keypair(),
    }
    .context("cannot make a key pair")?;
    std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
    let write = |name: &str, text: String, mode: u32| -> Result<PathBuf> {
        let path = dir.join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .with_context(|| format!("{}: not replaced", path.display()))?;
        f.write_all(text.as_bytes())
            .with_context(|| format!("{}", path.display()))?;
        Ok(path)
    };
    let secret = kp
        .sk
        .to_box(Some("sharehost fleet operator key"))
        .context("cannot encode the secret key")?
        .to_string();
    let public = kp
        .pk
        .to_box()
        .context("cannot encode the public key")?
        .to_string();
    let sk = write("operator.key", secret, 0o600)?;
    let pk = write("operator.pub", public, 0o644)?;
    println!(
        "secret key: {} (keep it; `--key` of every fleet command)",
        sk.display()
    );
    println!("public key: {}", pk.display());
    println!("[trust] of every host: keys = [\"{}\"]", kp.pk.to_base64());
    Ok(())
}

/// `sharehost fleet sign COMPONENT --key KEY`.
fn sign_component(component: &Path, key: &Path) -> Result<()> {
    let sk = load_key(key)?;
    // The component reader every load goes through: a regular file of at most the default
    // component bound, a component by its header (signing /dev/zero would never end).
    let bytes = sharehost::runtime::read_component(
        component,
        sharehost::runtime::DEFAULT_MAX_COMPONENT_BYTES,
    )?;
    let signature = minisign::sign(None, &sk, &bytes[..], None, None)
        .with_context(|| format!("cannot sign {}", component.display()))?;
    let path = sharehost::runtime::signature_path(component);
    std::fs::write(&path, signature.to_string()).with_context(|| format!("{}", path.display()))?;
    println!("signed: {}", path.display());
    Ok(())
}

/// The fleet as lines of text.
fn render(v: &FleetView) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "fleet {}", v.fleet);
    for (name, d) in &v.pipelines {
        let active = d
            .active
            .as_ref()
            .map_or("(each host's manifest)", |c| short(&c.digest));
        let _ = write!(out, "pipeline {name}: action {}, active {active}", d.seq);
        if let Some(c) = &d.canary {
            let _ = write!(
                out,
                ", canary {} ({}%, action {})",
                short(&c.component.digest),
                c.rules.percent,
                c.seq
            );
        }
        if let Some((c, sample)) = &d.shadow {
            let _ = write!(out, ", shadow {} (sample {sample})", short(&c.digest));
        }
        if let Some(o) = &d.last_canary {
            let _ = write!(
                out,
                ", last canary {} {}: {}",
                short(&o.candidate),
                if o.promoted {
                    "promoted"
                } else {
                    "rolled back"
                },
                o.reason
            );
        }
        let _ = writeln!(out);
    }
    for h in &v.hosts {
        let _ = writeln!(
            out,
            "host {}{}: heard {:.1} s ago, sharehost {}",
            h.status.host,
            if h.stale { " (stale)" } else { "" },
            h.age_ms as f64 / 1000.0,
            h.status.version
        );
        if let Some(c) = &h.conflict {
            let _ = writeln!(out, "  conflict: {}", c.reason);
        }
        for p in &h.status.pipelines {
            let _ = write!(
                out,
                "  {}: {}, active {}, action {}, {} records/s, judged {}, faults {}",
                p.name,
                p.state,
                short(&p.active),
                p.applied_seq,
                p.records_per_second,
                p.judged,
                p.faults
            );
            if let Some(c) = &p.canary {
                let _ = write!(
                    out,
                    ", canary {} batches {} ({} faulted) vs active {}",
                    short(&c.candidate),
                    c.candidate_tally.batches,
                    c.candidate_tally.faulted_batches,
                    c.active_tally.batches
                );
            }
            if let Some(s) = &p.shadow {
                let _ = write!(out, ", shadow {}", short(s));
            }
            if let Some(r) = &p.refused {
                let _ = write!(out, ", NOT APPLIED: {r}");
            }
            let _ = writeln!(out);
        }
    }
    if let Some(r) = &v.last_refused {
        let _ = writeln!(out, "last refused record: {r}");
    }
    out
}
