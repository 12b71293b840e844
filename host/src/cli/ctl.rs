//! `sharehost ctl`: the admin API from the command line, so operators do not hand-write curl.
//!
//! Each subcommand is one HTTP request to the host's admin listener (plain HTTP/1.1, the
//! listener is meant for loopback or a private network): tables by default, the host's JSON
//! answer unchanged with `--json`. A non-2xx answer is an error that names the request, the
//! status and what the host said (its JSON `"error"`, or its plain-text body), and the command
//! exits non-zero.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use sharehost::rollout::{CanaryRequest, ShadowRequest};
use sharehost_api::{
    self as api, CanaryBody, CanaryState, CanaryStatus, CandidateStarted, PipelineRoute,
    PromoteAfterBody, RollbackIfBody, RollbackRequest, ShadowBody, ShadowStatus, ShadowStopped,
    SwapRequest, Tally, TenantStatus, VersionChanged, VersionCounters, VersionsStatus,
};

/// `sharehost ctl --admin URL [--token-env VAR] [--json] COMMAND`.
#[derive(Debug, clap::Args)]
pub struct CtlArgs {
    /// The host's admin listener, e.g. http://127.0.0.1:9464 (the manifest's `admin.listen`).
    #[arg(
        long,
        env = "SHAREHOST_ADMIN",
        value_name = "URL",
        required_unless_present = "manifest"
    )]
    pub admin: Option<String>,
    /// Take the admin listener (`admin.listen`, a wildcard address reached on loopback) and
    /// the token's variable (`admin.token_env`) from the host's manifest instead; `--admin`
    /// and `--token-env` win over it.
    #[arg(long, value_name = "MANIFEST")]
    pub manifest: Option<PathBuf>,
    /// Environment variable holding the bearer token (the manifest's `admin.token_env`); sent
    /// as `Authorization: Bearer ...`. Never pass the token itself as an argument.
    #[arg(long, value_name = "VAR")]
    pub token_env: Option<String>,
    /// Print the host's JSON answer instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Seconds to wait for an answer (a swap, shadow or canary compiles the component first).
    #[arg(long, default_value_t = 300, global = true)]
    pub timeout: u64,
    /// What to do.
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// The admin operations.
#[derive(Debug, clap::Subcommand)]
pub enum CtlCommand {
    /// Every pipeline: state, active version, counters, shadow and canary.
    Pipelines,
    /// The versions a pipeline keeps ready (hash, path, signer, loaded at, counters).
    Versions {
        /// Pipeline name.
        name: String,
    },
    /// Load a component and make it the active version.
    Swap {
        /// Pipeline name.
        name: String,
        /// Component path (sent absolute when it exists here; the host reads it).
        path: PathBuf,
    },
    /// Switch back to a kept version (the newest other one, or the one given), without
    /// compiling.
    Rollback {
        /// Pipeline name.
        name: String,
        /// Version hash or a prefix of it; default: the newest other version the host keeps.
        hash: Option<String>,
    },
    /// Let a candidate judge copies of the batches, compared and never acted on.
    Shadow {
        /// Pipeline name.
        name: String,
        /// Candidate component path.
        path: PathBuf,
        /// Fraction of batches copied to the candidate, 0 to 1 (host default 1).
        #[arg(long, value_name = "F")]
        sample: Option<f64>,
    },
    /// Stop the pipeline's shadow.
    ShadowStop {
        /// Pipeline name.
        name: String,
    },
    /// Give a candidate a share of the batches for real, promoted or rolled back automatically.
    Canary {
        /// Pipeline name.
        name: String,
        /// Candidate component path.
        path: PathBuf,
        /// Share of batches the candidate judges, in percent (0 < P <= 100).
        #[arg(long, value_name = "P")]
        percent: f64,
        /// Promote after this many candidate batches within bounds.
        #[arg(long, value_name = "N")]
        promote_after_batches: Option<u64>,
        /// Promote after this many seconds within bounds.
        #[arg(long, value_name = "S")]
        promote_after_seconds: Option<u64>,
        /// Roll back when a larger share of the candidate's batches fault (host default 0: at
        /// the first fault).
        #[arg(long, value_name = "F")]
        max_fault_rate: Option<f64>,
        /// Roll back when its reject rate exceeds the active version's by more than this, in
        /// rate points (0.05 = five percentage points, the host's default).
        #[arg(long, value_name = "F")]
        max_reject_rate_increase: Option<f64>,
        /// The same for releases (host default 0.05).
        #[arg(long, value_name = "F")]
        max_release_rate_increase: Option<f64>,
    },
    /// Stop the canary and roll it back.
    CanaryStop {
        /// Pipeline name.
        name: String,
    },
    /// Promote the canary now.
    Promote {
        /// Pipeline name.
        name: String,
    },
}

/// One request to the admin API: method, path, JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// GET, POST or DELETE.
    pub method: &'static str,
    /// Path from the admin root, e.g. `/pipelines/orders/swap`.
    pub path: String,
    /// JSON body (POST only).
    pub body: Option<Value>,
}

/// A component path as the host should read it: absolute when the file is here (so the host's
/// working directory does not matter), else as given (a path on the host's machine).
fn component_path(path: &std::path::Path) -> String {
    std::fs::canonicalize(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

impl CtlCommand {
    /// The request this command makes; argument mistakes the host would refuse anyway are
    /// caught here first, with the flag's name.
    pub fn call(&self) -> Result<Call> {
        let get = |route: PipelineRoute, name: &str| Call {
            method: "GET",
            path: route.path(name),
            body: None,
        };
        let delete = |route: PipelineRoute, name: &str| Call {
            method: "DELETE",
            path: route.path(name),
            body: None,
        };
        let post = |route: PipelineRoute, name: &str, body: Option<Value>| Call {
            method: "POST",
            path: route.path(name),
            body,
        };
        Ok(match self {
            CtlCommand::Pipelines => Call {
                method: "GET",
                path: api::PIPELINES.to_owned(),
                body: None,
            },
            CtlCommand::Versions { name } => get(PipelineRoute::Versions, name),
            CtlCommand::Swap { name, path } => post(
                PipelineRoute::Swap,
                name,
                Some(json(&SwapRequest {
                    path: component_path(path).into(),
                })?),
            ),
            CtlCommand::Rollback { name, hash } => post(
                PipelineRoute::Rollback,
                name,
                Some(json(&RollbackRequest { hash: hash.clone() })?),
            ),
            CtlCommand::Shadow { name, path, sample } => {
                let body = ShadowBody {
                    path: component_path(path).into(),
                    sample: *sample,
                };
                // The host's own check, so ctl refuses exactly what the host would.
                ShadowRequest::from(&body)
                    .validate()
                    .map_err(|e| anyhow!("--sample: {e}"))?;
                post(PipelineRoute::Shadow, name, Some(json(&body)?))
            }
            CtlCommand::ShadowStop { name } => delete(PipelineRoute::Shadow, name),
            CtlCommand::Canary {
                name,
                path,
                percent,
                promote_after_batches,
                promote_after_seconds,
                max_fault_rate,
                max_reject_rate_increase,
                max_release_rate_increase,
            } => {
                let promote = PromoteAfterBody {
                    batches: *promote_after_batches,
                    seconds: *promote_after_seconds,
                };
                let bounds = RollbackIfBody {
                    max_fault_rate: *max_fault_rate,
                    max_reject_rate_increase: *max_reject_rate_increase,
                    max_release_rate_increase: *max_release_rate_increase,
                };
                let body = CanaryBody {
                    path: component_path(path).into(),
                    percent: *percent,
                    promote_after: (promote != PromoteAfterBody::default()).then_some(promote),
                    rollback_if: (bounds != RollbackIfBody::default()).then_some(bounds),
                };
                // The host's own check on what it will read (its defaults filled in), so ctl
                // refuses exactly what the host would.
                CanaryRequest::from(&body)
                    .validate()
                    .map_err(|e| anyhow!("{e}"))?;
                post(PipelineRoute::Canary, name, Some(json(&body)?))
            }
            CtlCommand::CanaryStop { name } => delete(PipelineRoute::Canary, name),
            CtlCommand::Promote { name } => post(PipelineRoute::Promote, name, None),
        })
    }
}

/// A request body as the JSON sent.
fn json<T: serde::Serialize>(body: &T) -> Result<Value> {
    Ok(serde_json::to_value(body)?)
}

/// Where the admin listener is: host:port for the connection, the Host header, a path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    authority: String,
    prefix: String,
}

fn endpoint(url: &str) -> Result<Endpoint> {
    let rest = match url.split_once("://") {
        Some(("http", rest)) => rest,
        Some(_) => bail!(
            "--admin {url}: only http:// is supported (the admin listener speaks plain HTTP; reach a remote one through a tunnel)"
        ),
        None => url,
    };
    let (authority, prefix) = match rest.find('/') {
        Some(i) => {
            let (authority, path) = rest.split_at(i); // `i` is where a '/' begins
            (authority, path.trim_end_matches('/'))
        }
        None => (rest, ""),
    };
    if authority.is_empty() {
        bail!("--admin {url}: no host:port");
    }
    let authority = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    Ok(Endpoint {
        authority,
        prefix: prefix.to_owned(),
    })
}

/// The URL `ctl` reaches a listener bound at `listen` on: a wildcard address (0.0.0.0, [::])
/// on loopback, the same port. An ephemeral port (0) cannot be known from the manifest.
pub fn admin_url(listen: &str) -> Result<String> {
    let addr: std::net::SocketAddr = listen
        .parse()
        .map_err(|e| anyhow::anyhow!("not an address and port: {e}"))?;
    if addr.port() == 0 {
        bail!("the port is chosen when the host starts (0): pass --admin with the one it logged");
    }
    let ip = match addr.ip() {
        std::net::IpAddr::V4(v4) if v4.is_unspecified() => {
            std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
        }
        std::net::IpAddr::V6(v6) if v6.is_unspecified() => {
            std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
        }
        ip => ip,
    };
    Ok(format!(
        "http://{}",
        std::net::SocketAddr::new(ip, addr.port())
    ))
}

/// The host's answer: status and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: http::StatusCode,
    /// Body bytes as text (lossy).
    pub body: String,
}

/// Sends `call` to the admin listener at `admin` with `token` as the bearer token.
pub async fn send(
    admin: &str,
    token: Option<&str>,
    call: &Call,
    timeout: Duration,
) -> Result<Answer> {
    let ep = endpoint(admin)?;
    let what = format!("{} {admin}{}", call.method, call.path);
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(&ep.authority)
            .await
            .with_context(|| format!("cannot reach the admin listener at {}", ep.authority))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake")?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let body = match &call.body {
            Some(v) => Bytes::from(serde_json::to_vec(v)?),
            None => Bytes::new(),
        };
        let mut req = http::Request::builder()
            .method(call.method)
            .uri(format!("{}{}", ep.prefix, call.path))
            .header(http::header::HOST, &ep.authority)
            .header(
                http::header::USER_AGENT,
                concat!("sharehost-ctl/", env!("CARGO_PKG_VERSION")),
            );
        // Every call that changes something says JSON, body or not: the host takes no other
        // content type there (a form on another site could send any other).
        if call.body.is_some() || !matches!(call.method, "GET" | "HEAD") {
            req = req.header(http::header::CONTENT_TYPE, api::JSON_CONTENT_TYPE);
        }
        if let Some(t) = token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let resp = sender.send_request(req.body(Full::new(body))?).await?;
        let status = resp.status();
        // Answers are small; a runaway one is cut rather than held whole.
        let limited = http_body_util::Limited::new(resp.into_body(), 16 << 20);
        let bytes = limited
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("reading the answer: {e}"))?
            .to_bytes();
        Ok::<_, anyhow::Error>(Answer {
            status,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| anyhow::anyhow!("{what}: no answer within {} s", timeout.as_secs()))?
        .with_context(|| what.clone())
}

/// What the host said in a failed answer: its JSON `"error"` when the body is JSON with one,
/// else the body as text (or the status's reason when empty).
pub fn error_text(answer: &Answer) -> String {
    if let Ok(v) = serde_json::from_str::<Value>(&answer.body)
        && let Some(e) = v.get("error")
    {
        return match e {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
    }
    let text = answer.body.trim();
    if text.is_empty() {
        answer
            .status
            .canonical_reason()
            .unwrap_or("no reason given")
            .to_owned()
    } else {
        text.to_owned()
    }
}

/// Runs `sharehost ctl`, writing the answer to `out`; a non-2xx answer is an error naming the
/// request, the status and what the host said.
pub async fn run(args: &CtlArgs, out: &mut dyn Write) -> Result<()> {
    let call = args.command.call()?;
    let from_manifest = match &args.manifest {
        Some(path) => Some(sharehost::manifest::Manifest::load_admin(path)?),
        None => None,
    };
    let admin = match (&args.admin, &from_manifest) {
        (Some(url), _) => url.clone(),
        (None, Some(spec)) => admin_url(&spec.listen).with_context(|| {
            format!(
                "{}: admin.listen {:?}",
                args.manifest.as_deref().unwrap_or(Path::new("")).display(),
                spec.listen
            )
        })?,
        (None, None) => bail!("--admin URL or --manifest MANIFEST is required"),
    };
    let token_env = args
        .token_env
        .clone()
        .or_else(|| from_manifest.and_then(|spec| spec.token_env));
    let token = match &token_env {
        Some(var) => Some(
            std::env::var(var)
                .with_context(|| format!("--token-env: environment variable {var} is not set"))?,
        ),
        None => None,
    };
    let answer = send(
        &admin,
        token.as_deref(),
        &call,
        Duration::from_secs(args.timeout),
    )
    .await?;
    if !answer.status.is_success() {
        let hint = if answer.status == http::StatusCode::UNAUTHORIZED && token.is_none() {
            " (the host requires a token: pass --token-env VAR)"
        } else {
            ""
        };
        bail!(
            "{} {}: the host answered {}: {}{hint}",
            call.method,
            call.path,
            answer.status,
            error_text(&answer)
        );
    }
    let value: Option<Value> = serde_json::from_str(&answer.body).ok();
    if args.json {
        match &value {
            Some(v) => writeln!(out, "{}", serde_json::to_string_pretty(v)?)?,
            None => write!(out, "{}", answer.body)?,
        }
        return Ok(());
    }
    let Some(value) = value else {
        let text = answer.body.trim();
        writeln!(out, "{}", if text.is_empty() { "ok" } else { text })?;
        return Ok(());
    };
    // The answer as its api type; one that does not read as it (another host version) is
    // shown as plain `key: value` lines.
    let typed = |out: &mut dyn Write| -> Option<Result<()>> {
        let v = value.clone();
        Some(match &args.command {
            CtlCommand::Pipelines => {
                let list: Vec<TenantStatus> = serde_json::from_value(v).ok()?;
                render_pipelines(out, &list)
            }
            CtlCommand::Versions { name } => {
                render_versions(out, name, &serde_json::from_value(v).ok()?)
            }
            CtlCommand::ShadowStop { .. } => {
                let stopped: ShadowStopped = serde_json::from_value(v).ok()?;
                writeln!(out, "pipeline: {}", stopped.pipeline)
                    .map_err(anyhow::Error::from)
                    .and_then(|()| render_shadow(out, "", &stopped.shadow))
            }
            CtlCommand::Shadow { .. } | CtlCommand::Canary { .. } => {
                let started: CandidateStarted = serde_json::from_value(v).ok()?;
                writeln!(
                    out,
                    "candidate: {}\npipeline: {}",
                    started.candidate, started.pipeline
                )
                .map_err(anyhow::Error::from)
            }
            _ => {
                let changed: VersionChanged = serde_json::from_value(v).ok()?;
                writeln!(
                    out,
                    "active_version: {}\npipeline: {}",
                    changed.active_version, changed.pipeline
                )
                .map_err(anyhow::Error::from)
            }
        })
    };
    match typed(out) {
        Some(done) => done,
        None => render_object(out, &value),
    }
}

/// A hash as tables show it: its first 12 characters.
fn short(hash: &str) -> String {
    hash.chars().take(12).collect()
}

/// A JSON value as a table cell: strings bare, null as `-`.
fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A number as its JSON spells it (`10.0`, `0.05`), the way tables showed the host's answer.
fn num(f: f64) -> String {
    text(&Value::from(f))
}

/// A cell with nothing to show.
const NONE: &str = "-";

/// An optional cell: the value, or `-`.
fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or(NONE.to_owned(), |v| v.to_string())
}

/// `GET /pipelines` as a table: one row per pipeline with the active version's counters, then
/// an indented line for each of its shadow, canary, signer and last swap error when present.
fn render_pipelines(out: &mut dyn Write, list: &[TenantStatus]) -> Result<()> {
    writeln!(
        out,
        "{:<16} {:<9} {:<12} {:>9} {:>8} {:>8} {:>6} {:>6} {:>8}  COMPONENT",
        "PIPELINE",
        "STATE",
        "ACTIVE",
        "ACCEPTED",
        "REJECTED",
        "RELEASED",
        "FAULTS",
        "DLQ",
        "INFLIGHT"
    )?;
    for tenant in list {
        let p = match tenant {
            TenantStatus::Failed(f) => {
                writeln!(
                    out,
                    "{:<16} {:<9} {:<12} {:>9} {:>8} {:>8} {:>6} {:>6} {:>8}  {}",
                    f.name, f.state, NONE, NONE, NONE, NONE, NONE, NONE, NONE, NONE,
                )?;
                writeln!(out, "  error: {}", f.error)?;
                continue;
            }
            TenantStatus::Pipeline(p) => p,
        };
        let counters = p.versions.get(&p.active_version);
        let count = |f: fn(&VersionCounters) -> u64| opt(counters.map(f));
        writeln!(
            out,
            "{:<16} {:<9} {:<12} {:>9} {:>8} {:>8} {:>6} {:>6} {:>8}  {}",
            p.name,
            p.state,
            short(&p.active_version),
            count(|c| c.accepted),
            count(|c| c.rejected),
            count(|c| c.released),
            count(|c| c.faults),
            p.dead_lettered,
            p.in_flight,
            p.component,
        )?;
        if let Some(e) = &p.last_error {
            writeln!(out, "  last_error: {e}")?;
        }
        if !p.unmapped_outputs.is_empty() {
            writeln!(
                out,
                "  unmapped_outputs: {}",
                serde_json::to_string(&p.unmapped_outputs)?
            )?;
        }
        if let Some(signer) = &p.signer {
            writeln!(out, "  signer: {signer}")?;
        }
        if let Some(e) = &p.last_swap_error {
            writeln!(out, "  last_swap_error: {e}")?;
        }
        if let Some(shadow) = &p.shadow {
            render_shadow(out, "  ", shadow)?;
        }
        if let Some(canary) = &p.canary {
            render_canary(out, "  ", canary)?;
        }
    }
    Ok(())
}

/// `k1 n1, k2 n2` of counts by kind (`accept 120, reject 3`), `none` when empty.
fn counts(m: &std::collections::BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "none".to_owned();
    }
    m.iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Most first disagreements a table shows (`--json` has them all).
const SHOWN_DISAGREEMENTS: usize = 5;

/// A shadow (`GET /pipelines`' `shadow`, or what `shadow-stop` answers): the candidate, what
/// was compared, agreement and disagreement by verdict kind, and the first disagreements with
/// their record coordinates.
fn render_shadow(out: &mut dyn Write, indent: &str, v: &ShadowStatus) -> Result<()> {
    writeln!(
        out,
        "{indent}shadow: candidate {} ({}), sample {}",
        short(&v.candidate),
        v.path,
        num(v.sample),
    )?;
    writeln!(
        out,
        "{indent}  compared {} records in {} batches; candidate faults {}; dropped {} batches ({} records); {} us/record",
        v.records,
        v.batches,
        v.faults,
        v.dropped_batches,
        v.dropped_records,
        num(v.us_per_record),
    )?;
    writeln!(out, "{indent}  agreed: {}", counts(&v.agreed))?;
    writeln!(out, "{indent}  disagreed: {}", counts(&v.disagreed))?;
    let first = &v.first_disagreements;
    if !first.is_empty() {
        writeln!(out, "{indent}  first disagreements:")?;
        for d in first.iter().take(SHOWN_DISAGREEMENTS) {
            writeln!(
                out,
                "{indent}    {}/{}/{}: active {}, candidate {}",
                d.topic, d.partition, d.offset, d.active, d.candidate,
            )?;
        }
        if first.len() > SHOWN_DISAGREEMENTS {
            writeln!(
                out,
                "{indent}    ... {} more (--json shows them)",
                first.len() - SHOWN_DISAGREEMENTS
            )?;
        }
    }
    Ok(())
}

/// One side of a canary: batches (faulted), records, reject and release rates.
fn tally(t: &Tally) -> String {
    let rate = |n: u64| match t.records {
        0 => "-".to_owned(),
        r => format!("{:.1}%", n as f64 * 100.0 / r as f64),
    };
    format!(
        "{} batches ({} faulted), {} records, rejected {} ({}), released {} ({})",
        t.batches,
        t.faulted_batches,
        t.records,
        t.rejected,
        rate(t.rejected),
        t.released,
        rate(t.released),
    )
}

/// A canary (`GET /pipelines`' `canary`): candidate, share, state and why, both sides' tallies
/// and its bounds.
fn render_canary(out: &mut dyn Write, indent: &str, v: &CanaryStatus) -> Result<()> {
    let reason = match &v.reason {
        Some(r) => format!(": {r}"),
        None => String::new(),
    };
    let state = match v.state {
        CanaryState::Running => "running",
        CanaryState::Promoted => "promoted",
        CanaryState::RolledBack => "rolled_back",
    };
    writeln!(
        out,
        "{indent}canary: candidate {} ({}), {}% of batches, {state} after {} s{reason}",
        short(&v.candidate),
        v.path,
        num(v.percent),
        v.seconds,
    )?;
    writeln!(out, "{indent}  candidate: {}", tally(&v.candidate_tally))?;
    writeln!(out, "{indent}  active:    {}", tally(&v.active_tally))?;
    let bounds = &v.rollback_if;
    writeln!(
        out,
        "{indent}  promote after: {} batches or {} s; roll back if fault rate > {}, reject rate +{}, release rate +{}",
        opt(v.promote_after.batches),
        opt(v.promote_after.seconds),
        num(bounds.max_fault_rate),
        num(bounds.max_reject_rate_increase),
        num(bounds.max_release_rate_increase),
    )?;
    Ok(())
}

/// A JSON value on one line: objects as `k=v` pairs (nested ones in braces), hashes shortened.
fn inline(v: &Value) -> String {
    match v {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| match v {
                Value::Object(_) => format!("{k}={{{}}}", inline(v)),
                Value::String(s) if s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit()) => {
                    format!("{k}={}", sharehost::pipeline::short(s))
                }
                other => format!("{k}={}", text(other)),
            })
            .collect::<Vec<_>>()
            .join(" "),
        other => text(other),
    }
}

/// `GET /pipelines/NAME/versions` as a table, the active version marked with `*`.
fn render_versions(out: &mut dyn Write, name: &str, value: &VersionsStatus) -> Result<()> {
    writeln!(out, "pipeline {name}: active {}", short(&value.active))?;
    writeln!(
        out,
        "  {:<12} {:<20} {:<16} {:>9} {:>8} {:>8} {:>6} {:>8}  PATH",
        "VERSION",
        "LOADED (UTC)",
        "SIGNER",
        "ACCEPTED",
        "REJECTED",
        "RELEASED",
        "FAULTS",
        "BATCHES"
    )?;
    for v in &value.versions {
        let mark = if v.active { "*" } else { " " };
        let c = &v.counters;
        let loaded = i64::try_from(v.loaded_at_ms).map_or("-".to_owned(), utc);
        writeln!(
            out,
            "{mark} {:<12} {:<20} {:<16} {:>9} {:>8} {:>8} {:>6} {:>8}  {}",
            short(&v.hash),
            loaded,
            opt(v.signer.as_deref()),
            c.accepted,
            c.rejected,
            c.released,
            c.faults,
            c.batches,
            v.path,
        )?;
    }
    Ok(())
}

/// Any other answer: `key: value` lines (`pipeline: orders`, `active_version: 3f2a...`).
fn render_object(out: &mut dyn Write, value: &Value) -> Result<()> {
    match value {
        Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                let shown = match v {
                    Value::Object(_) => inline(v),
                    other => text(other),
                };
                writeln!(out, "{k}: {shown}")?;
            }
        }
        Value::Object(_) => writeln!(out, "ok")?,
        other => writeln!(out, "{}", serde_json::to_string_pretty(other)?)?,
    }
    Ok(())
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS` (UTC), without a date crate: the
/// days-to-civil conversion of the proleptic Gregorian calendar.
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_pipeline_shows_its_error_and_a_misconfigured_one_its_outputs() {
        let failed = serde_json::json!(
            {"name": "bad", "state": "failed", "error": "init refused the configuration", "attempts": 3, "failing_for_s": 0}
        );
        let running = |name: &str, unmapped: &[&str]| {
            TenantStatus::Pipeline(Box::new(api::PipelineStatus {
                name: name.to_owned(),
                state: "running".to_owned(),
                unmapped_outputs: unmapped.iter().map(|s| (*s).to_owned()).collect(),
                ..Default::default()
            }))
        };
        let value = [
            TenantStatus::Failed(serde_json::from_value(failed).expect("a failure")),
            running("good", &[]),
            running("split", &["urgent"]),
        ];
        let mut out = Vec::new();
        render_pipelines(&mut out, &value).expect("render");
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains("  error: init refused the configuration"),
            "{text}"
        );
        assert!(text.contains("  unmapped_outputs: [\"urgent\"]"), "{text}");
        assert_eq!(
            text.matches("unmapped_outputs").count(),
            1,
            "an empty list is not shown: {text}"
        );
    }

    #[test]
    fn admin_urls_become_an_address_and_a_prefix() {
        let e = |a: &str, p: &str| Endpoint {
            authority: a.to_owned(),
            prefix: p.to_owned(),
        };
        assert_eq!(
            endpoint("http://127.0.0.1:9464").expect("url"),
            e("127.0.0.1:9464", "")
        );
        assert_eq!(
            endpoint("127.0.0.1:9464/").expect("bare"),
            e("127.0.0.1:9464", "")
        );
        assert_eq!(
            endpoint("http://admin/host1/").expect("prefix"),
            e("admin:80", "/host1")
        );
        let err = endpoint("https://h:1").expect_err("https").to_string();
        assert!(err.contains("only http://"), "{err}");
    }

    #[test]
    fn a_manifest_listener_becomes_a_url_to_reach_it() {
        assert_eq!(
            admin_url("127.0.0.1:9464").expect("v4"),
            "http://127.0.0.1:9464"
        );
        assert_eq!(
            admin_url("0.0.0.0:9464").expect("any v4"),
            "http://127.0.0.1:9464"
        );
        assert_eq!(admin_url("[::]:9464").expect("any v6"), "http://[::1]:9464");
        let e = admin_url("127.0.0.1:0").expect_err("ephemeral").to_string();
        assert!(e.contains("pass --admin"), "{e}");
        assert!(admin_url("localhost:9464").is_err());
    }

    #[test]
    fn dates_are_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_700_000_000_123), "2023-11-14 22:13:20");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
    }

    #[test]
    fn names_are_one_path_segment() {
        assert_eq!(api::segment("orders-v2.eu"), "orders-v2.eu");
        assert_eq!(api::segment("a/b c"), "a%2Fb%20c");
    }
}
