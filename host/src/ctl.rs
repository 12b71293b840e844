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
use serde_json::{Value, json};

use crate::rollout::{CanaryRequest, PromoteAfter, RollbackIf, ShadowRequest};

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

/// A pipeline name as one URL path segment (percent-encoded beyond unreserved characters).
fn segment(name: &str) -> String {
    let mut out = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
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
        let p = |name: &str, rest: &str| format!("/pipelines/{}{rest}", segment(name));
        let post = |path: String, body: Option<Value>| Call {
            method: "POST",
            path,
            body,
        };
        Ok(match self {
            CtlCommand::Pipelines => Call {
                method: "GET",
                path: "/pipelines".to_owned(),
                body: None,
            },
            CtlCommand::Versions { name } => Call {
                method: "GET",
                path: p(name, "/versions"),
                body: None,
            },
            CtlCommand::Swap { name, path } => post(
                p(name, "/swap"),
                Some(json!({ "path": component_path(path) })),
            ),
            CtlCommand::Rollback { name, hash } => post(
                p(name, "/rollback"),
                Some(match hash {
                    Some(h) => json!({ "hash": h }),
                    None => json!({}),
                }),
            ),
            CtlCommand::Shadow { name, path, sample } => {
                let mut body = json!({ "path": component_path(path) });
                // The host's own check, so ctl refuses exactly what the host would.
                let request = ShadowRequest {
                    path: path.clone(),
                    sample: sample.unwrap_or(1.0),
                };
                request.validate().map_err(|e| anyhow!("--sample: {e}"))?;
                if let Some(s) = sample {
                    body["sample"] = json!(s);
                }
                post(p(name, "/shadow"), Some(body))
            }
            CtlCommand::ShadowStop { name } => Call {
                method: "DELETE",
                path: p(name, "/shadow"),
                body: None,
            },
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
                // The host's own check on what it will read (its defaults filled in), so ctl
                // refuses exactly what the host would.
                let defaults = RollbackIf::default();
                let request = CanaryRequest {
                    path: path.clone(),
                    percent: *percent,
                    promote_after: PromoteAfter {
                        batches: *promote_after_batches,
                        seconds: *promote_after_seconds,
                    },
                    rollback_if: RollbackIf {
                        max_fault_rate: max_fault_rate.unwrap_or(defaults.max_fault_rate),
                        max_reject_rate_increase: max_reject_rate_increase
                            .unwrap_or(defaults.max_reject_rate_increase),
                        max_release_rate_increase: max_release_rate_increase
                            .unwrap_or(defaults.max_release_rate_increase),
                    },
                };
                request.validate().map_err(|e| anyhow!("{e}"))?;
                let mut body = json!({ "path": component_path(path), "percent": percent });
                let mut promote = serde_json::Map::new();
                if let Some(n) = promote_after_batches {
                    promote.insert("batches".into(), json!(n));
                }
                if let Some(s) = promote_after_seconds {
                    promote.insert("seconds".into(), json!(s));
                }
                if !promote.is_empty() {
                    body["promote_after"] = Value::Object(promote);
                }
                let mut bounds = serde_json::Map::new();
                for (key, v) in [
                    ("max_fault_rate", max_fault_rate),
                    ("max_reject_rate_increase", max_reject_rate_increase),
                    ("max_release_rate_increase", max_release_rate_increase),
                ] {
                    if let Some(v) = v {
                        bounds.insert(key.into(), json!(v));
                    }
                }
                if !bounds.is_empty() {
                    body["rollback_if"] = Value::Object(bounds);
                }
                post(p(name, "/canary"), Some(body))
            }
            CtlCommand::CanaryStop { name } => Call {
                method: "DELETE",
                path: p(name, "/canary"),
                body: None,
            },
            CtlCommand::Promote { name } => post(p(name, "/promote"), None),
        })
    }
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
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
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

/// The `[admin]` table of a manifest, read on its own: `ctl` may run where the manifest's
/// component files and TLS files are not, so the rest is not validated here.
fn manifest_admin(path: &Path) -> Result<crate::manifest::AdminSpec> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the manifest {}", path.display()))?;
    let value: toml::Table =
        toml::from_str(&text).with_context(|| format!("manifest {}", path.display()))?;
    let admin = value.get("admin").and_then(toml::Value::as_table);
    let field = |key: &str| -> Result<Option<String>> {
        match admin.and_then(|a| a.get(key)) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => bail!(
                "{}: admin.{key} must be a string, not a {}",
                path.display(),
                other.type_str()
            ),
        }
    };
    Ok(crate::manifest::AdminSpec {
        listen: field("listen")?
            .unwrap_or_else(|| crate::manifest::defaults::ADMIN_LISTEN.to_owned()),
        token_env: field("token_env")?,
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
        if call.body.is_some() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
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
        Some(path) => Some(manifest_admin(path)?),
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
    match &args.command {
        CtlCommand::Pipelines => render_pipelines(out, &value),
        CtlCommand::Versions { name } => render_versions(out, name, &value),
        CtlCommand::ShadowStop { .. } => {
            writeln!(out, "pipeline: {}", counter(&value, "pipeline"))?;
            match value.get("shadow") {
                Some(v) => render_shadow(out, "", v),
                None => render_object(out, &value),
            }
        }
        _ => render_object(out, &value),
    }
}

/// A hash as tables show it: its first 12 characters.
fn short(v: &Value) -> String {
    match v.as_str() {
        Some(s) => s.chars().take(12).collect(),
        None if v.is_null() => "-".to_owned(),
        None => v.to_string(),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn counter(v: &Value, key: &str) -> String {
    v.get(key).map_or("-".to_owned(), text)
}

/// `GET /pipelines` as a table: one row per pipeline with the active version's counters, then
/// an indented line for each of its shadow, canary, signer and last swap error when present.
fn render_pipelines(out: &mut dyn Write, value: &Value) -> Result<()> {
    let Some(list) = value.as_array() else {
        return render_object(out, value);
    };
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
    for p in list {
        let active = p.get("active_version").cloned().unwrap_or(Value::Null);
        let counters = active
            .as_str()
            .and_then(|h| p.get("versions")?.get(h))
            .cloned()
            .unwrap_or(Value::Null);
        writeln!(
            out,
            "{:<16} {:<9} {:<12} {:>9} {:>8} {:>8} {:>6} {:>6} {:>8}  {}",
            counter(p, "name"),
            counter(p, "state"),
            short(&active),
            counter(&counters, "accepted"),
            counter(&counters, "rejected"),
            counter(&counters, "released"),
            counter(&counters, "faults"),
            counter(p, "dead_lettered"),
            counter(p, "in_flight"),
            counter(p, "component"),
        )?;
        for key in [
            "error",
            "last_error",
            "unmapped_outputs",
            "signer",
            "last_swap_error",
        ] {
            match p.get(key) {
                None | Some(Value::Null) => {}
                Some(Value::Array(a)) if a.is_empty() => {}
                Some(v) => writeln!(out, "  {key}: {}", inline(v))?,
            }
        }
        if let Some(v) = p.get("shadow").filter(|v| !v.is_null()) {
            render_shadow(out, "  ", v)?;
        }
        if let Some(v) = p.get("canary").filter(|v| !v.is_null()) {
            render_canary(out, "  ", v)?;
        }
    }
    Ok(())
}

/// `k1 n1, k2 n2` of a JSON object of counts (`accept 120, reject 3`), `none` when empty.
fn counts(v: Option<&Value>) -> String {
    match v.and_then(Value::as_object) {
        Some(m) if !m.is_empty() => m
            .iter()
            .map(|(k, n)| format!("{k} {}", text(n)))
            .collect::<Vec<_>>()
            .join(", "),
        _ => "none".to_owned(),
    }
}

/// Most first disagreements a table shows (`--json` has them all).
const SHOWN_DISAGREEMENTS: usize = 5;

/// A shadow (`GET /pipelines`' `shadow`, or what `shadow-stop` answers): the candidate, what
/// was compared, agreement and disagreement by verdict kind, and the first disagreements with
/// their record coordinates.
fn render_shadow(out: &mut dyn Write, indent: &str, v: &Value) -> Result<()> {
    if v.get("candidate").is_none() {
        writeln!(out, "{indent}shadow: {}", inline(v))?;
        return Ok(());
    }
    writeln!(
        out,
        "{indent}shadow: candidate {} ({}), sample {}",
        short(&v["candidate"]),
        counter(v, "path"),
        counter(v, "sample"),
    )?;
    writeln!(
        out,
        "{indent}  compared {} records in {} batches; candidate faults {}; dropped {} batches ({} records); {} us/record",
        counter(v, "records"),
        counter(v, "batches"),
        counter(v, "faults"),
        counter(v, "dropped_batches"),
        counter(v, "dropped_records"),
        counter(v, "us_per_record"),
    )?;
    writeln!(out, "{indent}  agreed: {}", counts(v.get("agreed")))?;
    writeln!(out, "{indent}  disagreed: {}", counts(v.get("disagreed")))?;
    let first = v
        .get("first_disagreements")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if !first.is_empty() {
        writeln!(out, "{indent}  first disagreements:")?;
        for d in first.iter().take(SHOWN_DISAGREEMENTS) {
            writeln!(
                out,
                "{indent}    {}/{}/{}: active {}, candidate {}",
                counter(d, "topic"),
                counter(d, "partition"),
                counter(d, "offset"),
                counter(d, "active"),
                counter(d, "candidate"),
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
fn tally(v: Option<&Value>) -> String {
    let Some(t) = v.filter(|t| t.is_object()) else {
        return "-".to_owned();
    };
    let n = |k: &str| t.get(k).and_then(Value::as_u64).unwrap_or(0);
    let rate = |k: &str| match n("records") {
        0 => "-".to_owned(),
        r => format!("{:.1}%", n(k) as f64 * 100.0 / r as f64),
    };
    format!(
        "{} batches ({} faulted), {} records, rejected {} ({}), released {} ({})",
        n("batches"),
        n("faulted_batches"),
        n("records"),
        n("rejected"),
        rate("rejected"),
        n("released"),
        rate("released"),
    )
}

/// A canary (`GET /pipelines`' `canary`): candidate, share, state and why, both sides' tallies
/// and its bounds.
fn render_canary(out: &mut dyn Write, indent: &str, v: &Value) -> Result<()> {
    if v.get("candidate").is_none() {
        writeln!(out, "{indent}canary: {}", inline(v))?;
        return Ok(());
    }
    let reason = match v.get("reason") {
        Some(Value::String(r)) => format!(": {r}"),
        _ => String::new(),
    };
    writeln!(
        out,
        "{indent}canary: candidate {} ({}), {}% of batches, {} after {} s{reason}",
        short(&v["candidate"]),
        counter(v, "path"),
        counter(v, "percent"),
        counter(v, "state"),
        counter(v, "seconds"),
    )?;
    writeln!(
        out,
        "{indent}  candidate: {}",
        tally(v.get("candidate_tally"))
    )?;
    writeln!(out, "{indent}  active:    {}", tally(v.get("active_tally")))?;
    let field = |o: &str, k: &str| v.get(o).and_then(|o| o.get(k)).map_or("-".to_owned(), text);
    writeln!(
        out,
        "{indent}  promote after: {} batches or {} s; roll back if fault rate > {}, reject rate +{}, release rate +{}",
        field("promote_after", "batches"),
        field("promote_after", "seconds"),
        field("rollback_if", "max_fault_rate"),
        field("rollback_if", "max_reject_rate_increase"),
        field("rollback_if", "max_release_rate_increase"),
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
                    format!("{k}={}", &s[..12])
                }
                other => format!("{k}={}", text(other)),
            })
            .collect::<Vec<_>>()
            .join(" "),
        other => text(other),
    }
}

/// `GET /pipelines/NAME/versions` as a table, the active version marked with `*`.
fn render_versions(out: &mut dyn Write, name: &str, value: &Value) -> Result<()> {
    let Some(list) = value.get("versions").and_then(Value::as_array) else {
        return render_object(out, value);
    };
    writeln!(
        out,
        "pipeline {name}: active {}",
        short(value.get("active").unwrap_or(&Value::Null))
    )?;
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
    for v in list {
        let mark = if v.get("active").and_then(Value::as_bool) == Some(true) {
            "*"
        } else {
            " "
        };
        let counters = v.get("counters").cloned().unwrap_or(Value::Null);
        let loaded = v
            .get("loaded_at_ms")
            .and_then(Value::as_i64)
            .map_or("-".to_owned(), utc);
        writeln!(
            out,
            "{mark} {:<12} {:<20} {:<16} {:>9} {:>8} {:>8} {:>6} {:>8}  {}",
            short(v.get("hash").unwrap_or(&Value::Null)),
            loaded,
            counter(v, "signer"),
            counter(&counters, "accepted"),
            counter(&counters, "rejected"),
            counter(&counters, "released"),
            counter(&counters, "faults"),
            counter(&counters, "batches"),
            counter(v, "path"),
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
        let value = serde_json::json!([
            {"name": "bad", "state": "failed", "error": "init refused the configuration", "attempts": 3},
            {"name": "good", "state": "running", "unmapped_outputs": [], "last_error": null},
            {"name": "split", "state": "running", "unmapped_outputs": ["urgent"]},
        ]);
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
        assert_eq!(segment("orders-v2.eu"), "orders-v2.eu");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }
}
