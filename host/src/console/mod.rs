//! The console in the browser, served by the admin listener, and the read endpoints it needs
//! beyond `GET /pipelines`:
//!
//! - `GET /console`: one page (HTML, a script and a style sheet compiled into the binary, no
//!   build step) showing the host's pipelines, versions, rollouts, records per second, dead
//!   letters grouped by reason and recent faults; `GET /` leads there.
//! - `GET /host`: version, readiness, and whether actions need the bearer token.
//! - `GET /faults` (`?pipeline=NAME` for one): the last faults, newest first.
//! - `GET /pipelines/NAME/dead-letters`: the pipeline's dead letters grouped by reason.
//! - `POST /pipelines/NAME/dead-letters/replay`: replays chosen dead letters once, as
//!   `sharehost dlq replay` does (behind the bearer token).
//!
//! Reading is open to whoever reaches the listener, as `GET /pipelines` is; every action needs
//! the token when one is set. What plugins wrote (reasons, fault messages, record previews) is
//! untrusted: the page shows it as text, never as markup, and its content security policy
//! allows no script but its own.

pub mod dead_letters;

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use sharehost_api::{
    self as api, DeadLetterView, FaultsView, HostInfo, PipelineRoute, RecentFault, Refused,
    ReplayRequest, Replayed,
};

use crate::admin::context::{AdminState, authorized};
use crate::dlq::{self, DlqError, Summary};
use crate::manifest::Manifest;
use crate::recent_faults::KEPT_FAULTS;
use dead_letters::Collector;

const INDEX_HTML: &str = include_str!("../../console/index.html");
const CONSOLE_JS: &str = include_str!("../../console/console.js");
const CONSOLE_CSS: &str = include_str!("../../console/console.css");

/// Most faults one `GET /faults` lists (a host of 100 pipelines keeps 6,400, and the page asks
/// every 2 s).
const MAX_FAULTS_LISTED: usize = 200;

/// Characters of a dead letter's value the console previews.
const VALUE_PREVIEW: usize = 80;

/// The page may run its own script and style and talk to its own origin, nothing else: a
/// reason or fault text that slipped into markup could still not run.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// The console's routes, merged into the admin router.
pub fn routes() -> Router<Arc<AdminState>> {
    Router::new()
        .route("/", get(|| async { Redirect::to(api::CONSOLE) }))
        .route(
            api::CONSOLE,
            get(|| asset("text/html; charset=utf-8", INDEX_HTML)),
        )
        .route(
            api::CONSOLE_JS,
            get(|| asset("text/javascript; charset=utf-8", CONSOLE_JS)),
        )
        .route(
            api::CONSOLE_CSS,
            get(|| asset("text/css; charset=utf-8", CONSOLE_CSS)),
        )
        .route(api::HOST, get(host))
        .route(api::FAULTS, get(faults))
        .route(PipelineRoute::DeadLetters.pattern(), get(dead_letters))
        .route(PipelineRoute::DeadLettersReplay.pattern(), post(replay))
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn host(State(s): State<Arc<AdminState>>) -> Response {
    let ready = s.tenants.ready();
    axum::Json(HostInfo {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        actions_need_token: s.token.is_some(),
        ready: ready.is_ok(),
        not_ready: ready
            .err()
            .map(|why| why.lines().map(str::to_owned).collect())
            .unwrap_or_default(),
    })
    .into_response()
}

/// The value of `name` in a query string (`a=1&b=2`); pipeline names need no decoding (letters,
/// digits, `-` and `_`).
fn query_value<'a>(query: Option<&'a str>, name: &str) -> Option<&'a str> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
}

async fn faults(State(s): State<Arc<AdminState>>, RawQuery(query): RawQuery) -> Response {
    let only = query_value(query.as_deref(), "pipeline");
    let mut faults: Vec<RecentFault> = s
        .tenants
        .pipelines()
        .iter()
        .filter(|p| only.is_none_or(|name| p.name() == name))
        .flat_map(|p| p.recent_faults())
        .map(RecentFault::from)
        .collect();
    faults.sort_by_key(|f| std::cmp::Reverse(f.at_ms));
    let kept = faults.len();
    faults.truncate(MAX_FAULTS_LISTED);
    axum::Json(FaultsView {
        faults,
        kept,
        kept_per_pipeline: KEPT_FAULTS,
    })
    .into_response()
}

fn answer(status: StatusCode, pipeline: &str, error: String) -> Response {
    (
        status,
        axum::Json(Refused {
            error,
            pipeline: pipeline.to_owned(),
        }),
    )
        .into_response()
}

/// The manifest the host runs and the dead-letter topic of its pipeline `name`, or the status
/// and reason why not: 404 (no such pipeline, or no manifest to read), 500 (the manifest no
/// longer loads). `Ok((path, None))`: the pipeline keeps no dead letters.
fn dead_letter_topic(
    s: &AdminState,
    name: &str,
) -> Result<(PathBuf, Option<String>), (StatusCode, String)> {
    let Some(path) = &s.manifest else {
        return Err((
            StatusCode::NOT_FOUND,
            "this host serves no dead-letter view (it was started without a manifest)".into(),
        ));
    };
    let manifest = Manifest::load(path).map_err(|e| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the manifest no longer loads: {e}"),
        )
    })?;
    match manifest.pipelines.iter().find(|p| p.name == name) {
        Some(spec) => Ok((path.clone(), spec.dead_letter_topic.clone())),
        None => Err((StatusCode::NOT_FOUND, format!("no pipeline named {name:?}"))),
    }
}

/// What the console asks of the dead-letter reader for pipeline `pipeline` of `manifest`.
fn dlq_request(manifest: PathBuf, pipeline: &str) -> dlq::Request {
    dlq::Request {
        manifest,
        pipeline: pipeline.to_owned(),
        reason: None,
        offsets: None,
        partition: None,
        dry_run: false,
        state_dir: None,
        any_pipeline: false,
    }
}

/// Reads the pipeline's dead letters into a [`Collector`]: with what a replay would do with
/// each (a dry-run replay), or listed only.
async fn collect(
    req: &dlq::Request,
    dry_run_replay: bool,
) -> Result<(Summary, Collector), DlqError> {
    let mut collector = Collector::new(VALUE_PREVIEW);
    let absorb = |seen: &dlq::Seen<'_>| {
        collector.absorb(seen);
        Ok(())
    };
    let summary = if dry_run_replay {
        dlq::replay(
            &dlq::Request {
                dry_run: true,
                ..req.clone()
            },
            absorb,
        )
        .await?
    } else {
        dlq::list(req, absorb).await?
    };
    Ok((summary, collector))
}

/// `GET /pipelines/NAME/dead-letters`: the dead-letter topic read to its end, grouped by
/// reason shape, with what a replay would do per group (a dry-run replay: it reads the replay
/// state, writes nothing). While a replay of the topic runs (it holds the state's lock), or
/// when the state cannot be read, the groups come from a plain listing and their replay counts
/// are `null`, with `replay_state_error` saying why.
async fn dead_letters(State(s): State<Arc<AdminState>>, Path(name): Path<String>) -> Response {
    let (manifest, topic) = match dead_letter_topic(&s, &name) {
        Ok(found) => found,
        Err((status, why)) => return answer(status, &name, why),
    };
    let Some(topic) = topic else {
        return axum::Json(DeadLetterView::none(&name)).into_response();
    };
    let req = dlq_request(manifest, &name);
    let why = match collect(&req, true).await {
        Ok((summary, collector)) => {
            return axum::Json(dead_letters::view(&name, &topic, &collector, &summary))
                .into_response();
        }
        Err(e) => format!("{e:#}"),
    };
    match collect(&req, false).await {
        Ok((summary, collector)) => {
            let mut view = dead_letters::view(&name, &topic, &collector, &summary);
            view.replay_state_error = Some(why);
            axum::Json(view).into_response()
        }
        Err(e) => answer(StatusCode::BAD_GATEWAY, &name, format!("{e:#}")),
    }
}

/// Replays the chosen dead letters once (the replay state is the one `sharehost dlq` keeps,
/// so neither replays what the other did). Needs the token; like every action, it is only
/// reached with a JSON content type and no foreign origin ([`crate::admin::guard`]).
async fn replay(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    text: axum::body::Bytes,
) -> Response {
    if !authorized(&s, &headers) {
        return (
            StatusCode::UNAUTHORIZED,
            "a valid bearer token is required\n",
        )
            .into_response();
    }
    let body: ReplayRequest = match crate::api::parse_body(&text) {
        Ok(b) => b,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!(
                    r#"expected {{"reason"?: "REGEX", "offsets"?: "A..B", "partition"?: P, "dry_run"?: true}}: {e}"#
                ) + "\n",
            )
                .into_response();
        }
    };
    let (manifest, topic) = match dead_letter_topic(&s, &name) {
        Ok(found) => found,
        Err((status, why)) => return answer(status, &name, why),
    };
    if topic.is_none() {
        return answer(
            StatusCode::UNPROCESSABLE_ENTITY,
            &name,
            "the pipeline has no dead_letter_topic: it keeps no dead letters".into(),
        );
    }
    let req = dlq::Request {
        reason: body.reason.clone(),
        offsets: body.offsets,
        partition: body.partition,
        dry_run: body.dry_run,
        ..dlq_request(manifest, &name)
    };
    match dlq::replay(&req, |_: &dlq::Seen<'_>| Ok(())).await {
        Ok(summary) => {
            tracing::info!(
                pipeline = %name, reason = ?body.reason, dry_run = summary.dry_run,
                replayed = summary.replayed, already_replayed = summary.already_replayed,
                "dead letters replayed through the admin API"
            );
            axum::Json(Replayed {
                pipeline: name,
                summary,
            })
            .into_response()
        }
        Err(e) => answer(StatusCode::UNPROCESSABLE_ENTITY, &name, format!("{e:#}")),
    }
}

#[cfg(test)]
mod tests {
    use super::query_value;

    #[test]
    fn a_query_value_is_found_by_its_whole_name() {
        assert_eq!(
            query_value(Some("pipeline=orders"), "pipeline"),
            Some("orders")
        );
        assert_eq!(
            query_value(Some("x=1&pipeline=a-b_c"), "pipeline"),
            Some("a-b_c")
        );
        assert_eq!(query_value(Some("pipelines=orders"), "pipeline"), None);
        assert_eq!(query_value(None, "pipeline"), None);
    }
}
