//! Schema-encoded records: the Schema Registry wire format (a zero byte, the schema's id as a
//! 4-byte big-endian number, then the payload), decoded once in the host so that a plugin reads
//! the record as JSON through the SDK calls it already uses, and the plugin's JSON emits encoded
//! with the schema registered for their output's topic.
//!
//! Formats: Avro (apache-avro; the plugin sees the value as JSON: records and maps as objects,
//! unions as their branch's value, enums as their symbol's name, bytes and fixed as arrays of
//! numbers) and JSON Schema (the payload is JSON already; only the framing is taken off, and an
//! emit is validated against its output's schema with the `jsonschema` crate: no remote
//! reference fetched, patterns on the linear `regex` engine, so a schema cannot make the host
//! reach out or backtrack without end).
//! Schemas are fetched by id from the registry's Confluent-compatible API once and kept (at most
//! [`MAX_SCHEMAS`]); an output's schema is its subject's latest version under the topic name
//! strategy (`<topic>-value`), read once.
//!
//! What can go wrong, and where it goes: a record that is not framed, names an id the registry
//! does not know, or does not decode with its schema is a fault of that record (dead-lettered
//! with its own bytes and a reason naming the id and the error); an emit that does not conform
//! to its output's schema rejects its record the same way. A registry that cannot be reached
//! (refused, timed out, a 5xx) is no record's fault: the caller waits and asks again, losing
//! nothing ([`Unreachable`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;

use crate::runtime::Record;

mod avro_json;

/// Schemas kept by id: far more than a topic's producers use, and each is parsed once.
pub const MAX_SCHEMAS: usize = 1024;
/// The largest registry answer read: a schema of a few thousand fields is well under it.
const MAX_ANSWER_BYTES: usize = 4 << 20;
/// How long one registry request may take, connect to last byte.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes apache-avro may allocate for one value it decodes: a hostile payload claiming a
/// billion-element array is refused rather than allocated (its default is 512 MiB, per value).
pub const MAX_AVRO_ALLOCATION: usize = 16 << 20;

/// How a topic's keys or values, or an output's emits, are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Bytes as they are: nothing decoded or encoded.
    Raw,
    /// Avro in the registry's wire format.
    Avro,
    /// Protobuf in the registry's wire format (with its message indexes).
    Protobuf,
    /// JSON Schema in the registry's wire format.
    JsonSchema,
}

impl Format {
    /// The manifest's name of it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Raw => "raw",
            Format::Avro => "avro",
            Format::Protobuf => "protobuf",
            Format::JsonSchema => "json-schema",
        }
    }

    /// The format a manifest names, if it is one.
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "raw" => Some(Format::Raw),
            "avro" => Some(Format::Avro),
            "protobuf" => Some(Format::Protobuf),
            "json-schema" => Some(Format::JsonSchema),
            _ => None,
        }
    }
}

/// How the host authenticates to the registry.
#[derive(Clone, PartialEq, Eq)]
pub enum RegistryAuth {
    /// HTTP basic: a user name and a password (from a secret).
    Basic {
        /// The user name.
        username: String,
        /// The password.
        password: String,
    },
    /// A bearer token (from a secret).
    Bearer(String),
}

impl std::fmt::Debug for RegistryAuth {
    // Never the password or the token: a settings dump must not print a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryAuth::Basic { username, .. } => write!(f, "Basic({username}, [secret])"),
            RegistryAuth::Bearer(_) => f.write_str("Bearer([secret])"),
        }
    }
}

/// A pipeline's `[pipeline.schema]`: the registry and the formats.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaSettings {
    /// The registry's Confluent-compatible API base, e.g.
    /// `http://127.0.0.1:18081/apis/ccompat/v7`.
    pub registry: String,
    /// How the source topics' values are encoded.
    pub value: Format,
    /// How the source topics' keys are encoded.
    pub key: Format,
    /// Per output name, how its emits' values are encoded (others are raw).
    pub outputs: BTreeMap<String, Format>,
    /// Roots to trust for an `https` registry besides the system's.
    pub ca_file: Option<std::path::PathBuf>,
}

/// The registry cannot be reached now (refused, timed out, answered 5xx or garbage): nothing
/// about any record, so the caller waits and asks again.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the schema registry at {url} cannot be reached: {reason}")]
pub struct Unreachable {
    /// The registry's base URL.
    pub url: String,
    /// What went wrong.
    pub reason: String,
}

/// A registry setting that cannot work, found before any record.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SchemaSetupError {
    /// The URL is not `http://` or `https://` with a host.
    #[error("registry {0:?}: not an http:// or https:// URL with a host")]
    Url(String),
    /// The TLS roots could not be read.
    #[error("registry TLS: {0}")]
    Tls(String),
    /// A schema file (in place of the registry) cannot be used: names the file.
    #[error("schema file {0}")]
    File(String),
}

/// A schema, parsed once.
#[derive(Debug)]
enum Parsed {
    /// An Avro schema, and whether [`avro_json`] writes its values (else apache-avro decodes
    /// them).
    Avro(apache_avro::Schema, bool),
    /// A JSON Schema, compiled (validation of emits; records are taken as their producer's
    /// serializer wrote them).
    Json(Box<jsonschema::Validator>),
    /// A Protobuf schema's file: message indexes pick a message in it.
    Protobuf(prost_reflect::FileDescriptor),
    /// A schema type this host does not decode (Protobuf), or one it refuses (a recursive Avro
    /// schema, whose decoding depth only the payload would bound): each record using it is a
    /// fault naming why.
    Refused(String),
}

/// Why one record's key or value could not be decoded (the record's fault, its reason).
fn framing(bytes: &[u8]) -> Result<(u32, &[u8]), String> {
    match bytes {
        [0, a, b, c, d, payload @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), payload)),
        [0, ..] => Err(format!(
            "{} bytes: too short for the schema registry's framing (a zero byte and a 4-byte schema id)",
            bytes.len()
        )),
        [first, ..] => Err(format!(
            "not in the schema registry's framing: the first byte is {first}, not 0"
        )),
        [] => Err("empty: not in the schema registry's framing".into()),
    }
}

/// The registry's answer to a schema request.
#[derive(serde::Deserialize)]
struct SchemaAnswer {
    schema: String,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
    id: Option<u32>,
}

/// A registry client: plain HTTP/1.1 GETs with hyper (a connection per request: schemas are
/// asked for once each), TLS through the runtime's connector. Hand-written over hyper because
/// the host already carries hyper and rustls; a general HTTP client would bring a second TLS
/// stack for four GET requests.
pub struct Registry {
    /// The registry's base URL, or what stands in for it (the schema files).
    url: String,
    /// Where schemas are asked for; `None` when they were all read from files up front.
    endpoint: Option<Endpoint>,
    by_id: Mutex<Kept>,
    latest: Mutex<HashMap<String, (u32, Arc<Parsed>)>>,
}

/// Where the registry answers, and how the host signs in.
struct Endpoint {
    https: bool,
    authority: String,
    host: String,
    port: u16,
    prefix: String,
    auth: Option<String>,
    tls: Option<tokio_rustls::TlsConnector>,
}

/// A schema read from a file in place of the registry, so that `test-plugin` runs offline:
/// `SUBJECT[@ID]=FILE`, its type told by the file's extension (`.avsc`, `.proto`, `.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaFile {
    /// The subject it is the latest schema of, e.g. `orders-value`.
    pub subject: String,
    /// The id records framed with it carry (numbered from 1 in the order given otherwise).
    pub id: Option<u32>,
    /// The file.
    pub path: std::path::PathBuf,
}

impl std::str::FromStr for SchemaFile {
    type Err = String;

    fn from_str(s: &str) -> Result<SchemaFile, String> {
        let (name, path) = s
            .split_once('=')
            .filter(|(n, p)| !n.is_empty() && !p.is_empty())
            .ok_or_else(|| format!("{s:?}: expected SUBJECT=FILE or SUBJECT@ID=FILE"))?;
        let (subject, id) = match name.rsplit_once('@') {
            Some((subject, id)) => (
                subject,
                Some(id.parse::<u32>().map_err(|_| {
                    format!("{s:?}: the id {id:?} is not a number from 0 to 4294967295")
                })?),
            ),
            None => (name, None),
        };
        Ok(SchemaFile {
            subject: subject.to_owned(),
            id,
            path: path.into(),
        })
    }
}

/// Schemas by id, the oldest forgotten past [`MAX_SCHEMAS`].
#[derive(Default)]
struct Kept {
    map: HashMap<u32, Option<Arc<Parsed>>>,
    order: VecDeque<u32>,
}

impl Kept {
    fn put(&mut self, id: u32, parsed: Option<Arc<Parsed>>) {
        if self.map.insert(id, parsed).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > MAX_SCHEMAS {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// Parses what the registry answered for a schema.
fn parse_schema(answer: &SchemaAnswer) -> Parsed {
    match answer.schema_type.as_deref().unwrap_or("AVRO") {
        "AVRO" => match apache_avro::Schema::parse_str(&answer.schema) {
            Ok(schema) => match recursion(&schema) {
                Some(name) => Parsed::Refused(format!(
                    "its Avro schema is recursive ({name} contains itself), which this host does not decode: the payload alone would bound the depth"
                )),
                None => {
                    let direct = avro_json::writable(&schema);
                    Parsed::Avro(schema, direct)
                }
            },
            Err(e) => Parsed::Refused(format!("its Avro schema does not parse: {e}")),
        },
        "JSON" => match serde_json::from_str::<serde_json::Value>(&answer.schema)
            .map_err(|e| e.to_string())
            .and_then(|schema| {
                jsonschema::options()
                    .with_pattern_options(jsonschema::PatternOptions::regex())
                    .build(&schema)
                    .map_err(|e| e.to_string())
            }) {
            Ok(v) => Parsed::Json(Box::new(v)),
            Err(e) => Parsed::Refused(format!("its JSON Schema does not compile: {e}")),
        },
        "PROTOBUF" => match protobuf_file(&answer.schema) {
            Ok(file) => Parsed::Protobuf(file),
            Err(e) => Parsed::Refused(format!("its Protobuf schema does not compile: {e}")),
        },
        other => Parsed::Refused(format!(
            "its schema type is {other}, which this host does not decode (avro, protobuf and json-schema are)"
        )),
    }
}

/// The one file a Protobuf schema is: `.proto` text as the Confluent API serves it, compiled in
/// memory (only Google's well-known types may be imported: nothing is read from disk), or a
/// base64 `FileDescriptorProto`, which some serializers register instead.
fn protobuf_file(schema: &str) -> Result<prost_reflect::FileDescriptor, String> {
    use base64::Engine as _;
    use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};
    const NAME: &str = "schema.proto";
    let looks_encoded = !schema.contains([';', ' ', '\n', '{']);
    if looks_encoded
        && let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(schema.trim())
    {
        let mut pool = prost_reflect::DescriptorPool::global();
        pool.decode_file_descriptor_proto(bytes.as_slice())
            .map_err(|e| e.to_string())?;
        return pool
            .files()
            .last()
            .ok_or_else(|| "an empty descriptor".to_owned());
    }
    struct One(String);
    impl FileResolver for One {
        fn open_file(&self, name: &str) -> Result<File, protox::Error> {
            if name == NAME {
                File::from_source(name, &self.0)
            } else {
                Err(protox::Error::file_not_found(name))
            }
        }
    }
    let mut chain = ChainFileResolver::new();
    chain.add(One(schema.to_owned()));
    chain.add(GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(chain);
    compiler.open_file(NAME).map_err(|e| e.to_string())?;
    compiler
        .descriptor_pool()
        .get_file_by_name(NAME)
        .ok_or_else(|| "the compiled schema has no file".to_owned())
}

/// Most message indexes a Protobuf payload may name: far deeper than any real nesting.
const MAX_MESSAGE_INDEXES: usize = 32;

/// Reads one zig-zag varint (the message indexes' encoding).
fn zigzag(bytes: &mut &[u8]) -> Option<i64> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    None
}

/// The message a payload's indexes name in `file`, and the payload after them.
fn protobuf_message<'p>(
    file: &prost_reflect::FileDescriptor,
    mut payload: &'p [u8],
) -> Result<(prost_reflect::MessageDescriptor, &'p [u8]), String> {
    let count = zigzag(&mut payload).ok_or("the message indexes are cut short")?;
    let indexes: Vec<i64> = if count == 0 {
        vec![0]
    } else {
        let n = usize::try_from(count)
            .ok()
            .filter(|n| *n <= MAX_MESSAGE_INDEXES)
            .ok_or_else(|| format!("{count} message indexes"))?;
        (0..n)
            .map(|_| zigzag(&mut payload).ok_or("the message indexes are cut short"))
            .collect::<Result<_, _>>()?
    };
    let pick = |i: i64, mut it: Box<dyn Iterator<Item = prost_reflect::MessageDescriptor> + '_>| {
        usize::try_from(i)
            .ok()
            .and_then(|i| it.nth(i))
            .ok_or_else(|| format!("no message at index {i}"))
    };
    let mut message = pick(indexes[0], Box::new(file.messages()))?;
    for &i in &indexes[1..] {
        let children: Vec<_> = message.child_messages().collect();
        message = pick(i, Box::new(children.into_iter()))?;
    }
    Ok((message, payload))
}

/// The name of a named type that refers to itself, directly or through others, if any.
fn recursion(schema: &apache_avro::Schema) -> Option<String> {
    use apache_avro::Schema as S;
    fn walk(s: &apache_avro::Schema, open: &mut Vec<String>) -> Option<String> {
        match s {
            S::Ref { name } => {
                let full = name.fullname(None);
                open.contains(&full).then_some(full)
            }
            S::Record(r) => {
                open.push(r.name.fullname(None));
                let found = r.fields.iter().find_map(|f| walk(&f.schema, open));
                open.pop();
                found
            }
            S::Array(a) => walk(&a.items, open),
            S::Map(m) => walk(&m.types, open),
            S::Union(u) => u.variants().iter().find_map(|v| walk(v, open)),
            _ => None,
        }
    }
    walk(schema, &mut Vec::new())
}

impl Registry {
    /// A client of the registry at `url`.
    pub fn new(
        url: &str,
        auth: Option<RegistryAuth>,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Registry, SchemaSetupError> {
        let uri: http::Uri = url
            .parse()
            .map_err(|_| SchemaSetupError::Url(url.to_owned()))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(SchemaSetupError::Url(url.to_owned())),
        };
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| SchemaSetupError::Url(url.to_owned()))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let authority = uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .ok_or_else(|| SchemaSetupError::Url(url.to_owned()))?;
        let prefix = uri.path().trim_end_matches('/').to_owned();
        let tls = if https {
            Some(
                crate::runtime::tls_connector(ca_file, true)
                    .map_err(|e| SchemaSetupError::Tls(e.to_string()))?,
            )
        } else {
            None
        };
        let auth = auth.map(|a| match a {
            RegistryAuth::Basic { username, password } => {
                use base64::Engine as _;
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD
                        .encode(format!("{username}:{password}"))
                )
            }
            RegistryAuth::Bearer(token) => format!("Bearer {token}"),
        });
        Ok(Registry {
            url: url.to_owned(),
            endpoint: Some(Endpoint {
                https,
                authority,
                host,
                port,
                prefix,
                auth,
                tls,
            }),
            by_id: Mutex::default(),
            latest: Mutex::default(),
        })
    }

    /// A registry of the schemas in `files`, read and compiled now: each is its subject's
    /// latest schema and answers for its id; nothing else is known and nothing is fetched.
    pub fn from_files(files: &[SchemaFile]) -> Result<Registry, SchemaSetupError> {
        let mut by_id = Kept::default();
        let mut latest = HashMap::new();
        let mut next = 1u32;
        for file in files {
            let shown = file.path.display();
            let schema_type = match file.path.extension().and_then(|e| e.to_str()) {
                Some("avsc") => "AVRO",
                Some("proto") => "PROTOBUF",
                Some("json") => "JSON",
                _ => {
                    return Err(SchemaSetupError::File(format!(
                        "{shown}: the type is told by the extension: .avsc (Avro), .proto (Protobuf) or .json (JSON Schema)"
                    )));
                }
            };
            let too_big = || {
                SchemaSetupError::File(format!(
                    "{shown}: larger than {} MiB, more than any schema",
                    MAX_ANSWER_BYTES >> 20
                ))
            };
            // Read through a bound, not by the size the file claims: a FIFO or a device (a
            // link named `x.avsc` to /dev/zero) says 0 and never ends.
            let mut text = String::new();
            std::io::Read::read_to_string(
                &mut std::io::Read::take(
                    std::fs::File::open(&file.path)
                        .map_err(|e| SchemaSetupError::File(format!("{shown}: {e}")))?,
                    MAX_ANSWER_BYTES as u64 + 1,
                ),
                &mut text,
            )
            .map_err(|e| SchemaSetupError::File(format!("{shown}: {e}")))?;
            if text.len() > MAX_ANSWER_BYTES {
                return Err(too_big());
            }
            let parsed = parse_schema(&SchemaAnswer {
                schema: text,
                schema_type: Some(schema_type.to_owned()),
                id: None,
            });
            if let Parsed::Refused(why) = &parsed {
                return Err(SchemaSetupError::File(format!("{shown}: {why}")));
            }
            let id = file.id.unwrap_or(next);
            if by_id.map.contains_key(&id) {
                return Err(SchemaSetupError::File(format!(
                    "{shown}: schema id {id} is another file's"
                )));
            }
            next = next.max(id.saturating_add(1));
            let parsed = Arc::new(parsed);
            by_id.put(id, Some(parsed.clone()));
            if latest.insert(file.subject.clone(), (id, parsed)).is_some() {
                return Err(SchemaSetupError::File(format!(
                    "{shown}: subject {} has a file already",
                    file.subject
                )));
            }
        }
        Ok(Registry {
            url: "the schema files".into(),
            endpoint: None,
            by_id: Mutex::new(by_id),
            latest: Mutex::new(latest),
        })
    }

    /// Where schemas come from, for reasons: "the registry" or "the schema files".
    fn source(&self) -> &'static str {
        if self.endpoint.is_some() {
            "the registry"
        } else {
            "the schema files"
        }
    }

    fn unreachable(&self, reason: impl Into<String>) -> Unreachable {
        Unreachable {
            url: self.url.clone(),
            reason: reason.into(),
        }
    }

    /// GETs `path` under the base; the status and the body (bounded).
    async fn get(&self, path: &str) -> Result<(http::StatusCode, Bytes), Unreachable> {
        let Some(ep) = &self.endpoint else {
            return Err(self.unreachable("no registry: the schemas are files"));
        };
        let exchange = async {
            let stream = tokio::net::TcpStream::connect((ep.host.as_str(), ep.port))
                .await
                .map_err(|e| self.unreachable(format!("connect: {e}")))?;
            let request = http::Request::get(format!("{}{path}", ep.prefix))
                .header(http::header::HOST, &ep.authority)
                .header(
                    http::header::ACCEPT,
                    "application/vnd.schemaregistry.v1+json, application/json",
                )
                .header(
                    http::header::USER_AGENT,
                    concat!("sharehost/", env!("CARGO_PKG_VERSION")),
                );
            let request = match &ep.auth {
                Some(a) => request.header(http::header::AUTHORIZATION, a),
                None => request,
            }
            .body(Empty::<Bytes>::new())
            .map_err(|e| self.unreachable(format!("request: {e}")))?;
            let response = match (&ep.tls, ep.https) {
                (Some(tls), true) => {
                    let name = rustls_pki_types::ServerName::try_from(ep.host.clone())
                        .map_err(|e| self.unreachable(format!("server name: {e}")))?;
                    let stream = tls
                        .connect(name, stream)
                        .await
                        .map_err(|e| self.unreachable(format!("TLS: {e}")))?;
                    send(TokioIo::new(stream), request).await
                }
                _ => send(TokioIo::new(stream), request).await,
            }
            .map_err(|e| self.unreachable(e))?;
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| self.unreachable(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| {
                self.unreachable(format!("no answer within {} s", REQUEST_TIMEOUT.as_secs()))
            })?
    }

    /// The schema of `id`, fetched once; `None` when the registry does not know it.
    async fn by_id(&self, id: u32) -> Result<Option<Arc<Parsed>>, Unreachable> {
        if let Some(kept) = self.by_id.lock().map.get(&id) {
            return Ok(kept.clone());
        }
        if self.endpoint.is_none() {
            return Ok(None);
        }
        let (status, body) = self.get(&format!("/schemas/ids/{id}")).await?;
        let parsed = match status.as_u16() {
            200 => {
                let answer: SchemaAnswer = serde_json::from_slice(&body).map_err(|e| {
                    self.unreachable(format!("schema {id}: an answer that is not a schema: {e}"))
                })?;
                Some(Arc::new(parse_schema(&answer)))
            }
            404 => None,
            401 | 403 => {
                return Err(self.unreachable(format!(
                    "refused ({status}): check the registry's credentials"
                )));
            }
            _ => return Err(self.unreachable(format!("schema {id}: answered {status}"))),
        };
        self.by_id.lock().put(id, parsed.clone());
        Ok(parsed)
    }

    /// The latest schema of `subject` and its id, fetched once; `None` when the subject has
    /// none.
    async fn latest(&self, subject: &str) -> Result<Option<(u32, Arc<Parsed>)>, Unreachable> {
        if let Some(kept) = self.latest.lock().get(subject) {
            return Ok(Some(kept.clone()));
        }
        if self.endpoint.is_none() {
            return Ok(None);
        }
        let encoded: String = subject
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (status, body) = self
            .get(&format!("/subjects/{encoded}/versions/latest"))
            .await?;
        match status.as_u16() {
            200 => {
                let answer: SchemaAnswer = serde_json::from_slice(&body).map_err(|e| {
                    self.unreachable(format!("subject {subject}: not a schema: {e}"))
                })?;
                let id = answer.id.ok_or_else(|| {
                    self.unreachable(format!("subject {subject}: the answer has no id"))
                })?;
                let parsed = Arc::new(parse_schema(&answer));
                self.latest
                    .lock()
                    .insert(subject.to_owned(), (id, parsed.clone()));
                Ok(Some((id, parsed)))
            }
            404 => Ok(None),
            _ => Err(self.unreachable(format!("subject {subject}: answered {status}"))),
        }
    }
}

/// One request on a fresh HTTP/1.1 connection.
async fn send<T>(
    io: TokioIo<T>,
    request: http::Request<Empty<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
        .send_request(request)
        .await
        .map_err(|e| format!("request: {e}"))
}

/// A pipeline's schemas: its registry and what is decoded and encoded.
#[derive(Debug)]
pub struct Schemas {
    registry: Registry,
    value: Format,
    key: Format,
    /// Output name → (its topic's subject, format), for the outputs that are not raw.
    outputs: BTreeMap<String, (String, Format)>,
}

/// What decoding a batch's records gave: each record's fault (a reason), if any, and the
/// originals of what was decoded, to give back before a record is written anywhere.
#[derive(Debug, Default)]
pub struct Decoded {
    /// Per record: `Some(reason)` when its key or value could not be decoded.
    pub faults: Vec<Option<String>>,
    /// Per record: the key and value as they came, when decoding replaced them.
    originals: Vec<Option<(Option<Bytes>, Option<Bytes>)>>,
}

impl Decoded {
    /// Per record, its own key and value where decoding replaced them: what goes back into the
    /// record before anything writes it (a dead letter carries the bytes the producer wrote,
    /// not the JSON the plugin read).
    pub fn into_originals(self) -> Vec<Option<(Option<Bytes>, Option<Bytes>)>> {
        self.originals
    }

    /// How many records faulted.
    pub fn fault_count(&self) -> usize {
        self.faults.iter().filter(|f| f.is_some()).count()
    }
}

impl Schemas {
    /// The schemas of a pipeline: `outputs` maps output names to their topics.
    pub fn new(
        settings: &SchemaSettings,
        auth: Option<RegistryAuth>,
        outputs: &BTreeMap<String, String>,
    ) -> Result<Schemas, SchemaSetupError> {
        let registry = Registry::new(&settings.registry, auth, settings.ca_file.as_deref())?;
        Ok(Schemas::with(settings, registry, outputs))
    }

    /// The schemas of a pipeline taken from `files` instead of its registry (which is never
    /// asked): `test-plugin` offline.
    pub fn from_files(
        settings: &SchemaSettings,
        files: &[SchemaFile],
        outputs: &BTreeMap<String, String>,
    ) -> Result<Schemas, SchemaSetupError> {
        Ok(Schemas::with(
            settings,
            Registry::from_files(files)?,
            outputs,
        ))
    }

    fn with(
        settings: &SchemaSettings,
        registry: Registry,
        outputs: &BTreeMap<String, String>,
    ) -> Schemas {
        // Process-wide in apache-avro, set before any value is decoded; later calls keep it.
        apache_avro::util::max_allocation_bytes(MAX_AVRO_ALLOCATION);
        Schemas {
            registry,
            value: settings.value,
            key: settings.key,
            outputs: settings
                .outputs
                .iter()
                .filter(|(_, f)| **f != Format::Raw)
                .filter_map(|(name, f)| {
                    outputs
                        .get(name)
                        .map(|topic| (name.clone(), (format!("{topic}-value"), *f)))
                })
                .collect(),
        }
    }

    /// Encodes each key and value given as JSON, not yet framed, with the latest schema of its
    /// topic's subject (`<topic>-key`, `<topic>-value`), as its producer's serializer would:
    /// `test-plugin`'s records are written as the JSON they stand for, and the plugin then
    /// reads what it would read from the topic. A value already framed (first byte zero) or not
    /// JSON stays as it is. `Ok(Err(reason))` names the record (1-based) when one cannot be
    /// encoded: the input is wrong, not the plugin.
    pub async fn frame_json(
        &self,
        records: &mut [Record],
    ) -> Result<Result<(), String>, Unreachable> {
        for (i, r) in records.iter_mut().enumerate() {
            for (part, format, slot) in [
                ("key", self.key, &mut r.key),
                ("value", self.value, &mut r.value),
            ] {
                let Some(bytes) = slot.as_deref().filter(|_| format != Format::Raw) else {
                    continue;
                };
                if bytes.first() == Some(&0)
                    || serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_err()
                {
                    continue;
                }
                let subject = format!("{}-{part}", r.topic);
                let at = || format!("record {} (topic {}, offset {})", i + 1, r.topic, r.offset);
                let Some((id, schema)) = self.registry.latest(&subject).await? else {
                    return Ok(Err(format!(
                        "{}: {part} is JSON to encode, but subject {subject} has no schema in {} \
                         (give the record the \"topic\" its producer writes to, or its subject a \
                         --schema-file)",
                        at(),
                        self.registry.source()
                    )));
                };
                match encode_payload(id, &schema, format, bytes) {
                    Ok(framed) => *slot = Some(framed),
                    Err(why) => {
                        return Ok(Err(format!(
                            "{}: {part} as subject {subject} (schema id {id}): {}",
                            at(),
                            why.replace("the emit", "it")
                        )));
                    }
                }
            }
        }
        Ok(Ok(()))
    }

    /// Whether records are decoded before the plugin sees them.
    pub fn decodes(&self) -> bool {
        self.value != Format::Raw || self.key != Format::Raw
    }

    /// Decodes the keys and values of `records` in place into JSON; a record that cannot be
    /// decoded keeps its bytes and gets a reason. `Err` when the registry cannot be reached
    /// (nothing is changed then).
    pub async fn decode(&self, records: &mut [Record]) -> Result<Decoded, Unreachable> {
        // Every schema the batch needs, first: a registry that cannot be reached changes
        // nothing.
        for r in records.iter() {
            for (format, bytes) in [(self.key, &r.key), (self.value, &r.value)] {
                if format != Format::Raw
                    && let Some(Ok((id, _))) = bytes.as_deref().map(framing)
                {
                    self.registry.by_id(id).await?;
                }
            }
        }
        let mut out = Decoded::default();
        for r in records.iter_mut() {
            let key = self.decode_one(self.key, r.key.as_deref()).await?;
            let value = self.decode_one(self.value, r.value.as_deref()).await?;
            match (key, value) {
                (Err(why), _) => {
                    out.faults.push(Some(format!("key: {why}")));
                    out.originals.push(None);
                }
                (_, Err(why)) => {
                    out.faults.push(Some(format!("value: {why}")));
                    out.originals.push(None);
                }
                (Ok(k), Ok(v)) => {
                    out.faults.push(None);
                    if k.is_none() && v.is_none() {
                        out.originals.push(None);
                        continue;
                    }
                    let original = (r.key.clone(), r.value.clone());
                    if let Some(k) = k {
                        r.key = Some(k);
                    }
                    if let Some(v) = v {
                        r.value = Some(v);
                    }
                    out.originals.push(Some(original));
                }
            }
        }
        Ok(out)
    }

    /// One key or value: `Ok(None)` when it stays as it is (raw, or null: a tombstone has no
    /// schema), `Ok(Some(json))` decoded, `Err(reason)` for the record's fault.
    async fn decode_one(
        &self,
        format: Format,
        bytes: Option<&[u8]>,
    ) -> Result<Result<Option<Bytes>, String>, Unreachable> {
        let Some(bytes) = bytes.filter(|_| format != Format::Raw) else {
            return Ok(Ok(None));
        };
        let (id, payload) = match framing(bytes) {
            Ok(f) => f,
            Err(why) => return Ok(Err(why)),
        };
        let Some(schema) = self.registry.by_id(id).await? else {
            return Ok(Err(format!(
                "schema id {id} is not in {}",
                self.registry.source()
            )));
        };
        Ok(decode_payload(id, &schema, format, payload).map(Some))
    }

    /// Encodes `value`, emitted to `output`, with the output's schema: `Ok(None)` for an output
    /// that is raw (the emit goes as it is), `Ok(Some(Err(reason)))` when it does not conform
    /// (its record's fault). `Err` when the registry cannot be reached.
    pub async fn encode(
        &self,
        output: &str,
        value: Option<&[u8]>,
    ) -> Result<Option<Result<Option<Bytes>, String>>, Unreachable> {
        let Some((subject, format)) = self.outputs.get(output) else {
            return Ok(None);
        };
        let Some(value) = value else {
            return Ok(Some(Ok(None)));
        };
        let Some((id, schema)) = self.registry.latest(subject).await? else {
            return Ok(Some(Err(format!(
                "output {output}: subject {subject} has no schema in {}",
                self.registry.source()
            ))));
        };
        Ok(Some(
            encode_payload(id, &schema, *format, value)
                .map(Some)
                .map_err(|why| format!("output {output} (schema id {id}): {why}")),
        ))
    }
}

/// A payload decoded with its schema into JSON bytes, or the reason it cannot be.
fn decode_payload(
    id: u32,
    schema: &Parsed,
    format: Format,
    payload: &[u8],
) -> Result<Bytes, String> {
    match (schema, format) {
        (Parsed::Refused(why), _) => Err(format!("schema id {id}: {why}")),
        (Parsed::Avro(schema, true), Format::Avro) => match avro_json::to_json(schema, payload) {
            Ok(json) => Ok(Bytes::from(json)),
            Err(avro_json::Unwritten::Invalid(why)) => Err(format!(
                "schema id {id}: the payload does not decode as Avro: {why}"
            )),
            Err(avro_json::Unwritten::Fallback) => avro_value_json(id, schema, payload),
        },
        (Parsed::Avro(schema, false), Format::Avro) => avro_value_json(id, schema, payload),
        (Parsed::Protobuf(file), Format::Protobuf) => {
            let (message, body) =
                protobuf_message(file, payload).map_err(|e| format!("schema id {id}: {e}"))?;
            let value = prost_reflect::DynamicMessage::decode(message, body).map_err(|e| {
                format!("schema id {id}: the payload does not decode as Protobuf: {e}")
            })?;
            let mut out = serde_json::Serializer::new(Vec::new());
            value
                .serialize_with_options(
                    &mut out,
                    &prost_reflect::SerializeOptions::new()
                        .use_proto_field_name(true)
                        .stringify_64_bit_integers(false)
                        .skip_default_fields(false),
                )
                .map_err(|e| format!("schema id {id}: the message has no JSON form: {e}"))?;
            Ok(Bytes::from(out.into_inner()))
        }
        (Parsed::Json(_), Format::JsonSchema) => {
            serde_json::from_slice::<serde::de::IgnoredAny>(payload)
                .map_err(|e| format!("schema id {id}: the payload is not JSON: {e}"))?;
            Ok(Bytes::copy_from_slice(payload))
        }
        (Parsed::Avro(..) | Parsed::Json(_) | Parsed::Protobuf(_), f) => Err(format!(
            "schema id {id} is {}, not {} as the pipeline says",
            match schema {
                Parsed::Avro(..) => "Avro",
                Parsed::Protobuf(_) => "Protobuf",
                _ => "JSON Schema",
            },
            f.name()
        )),
    }
}

/// An Avro payload decoded by apache-avro into its value, converted to JSON and written: the
/// way for the schemas [`avro_json`] does not write.
fn avro_value_json(id: u32, schema: &apache_avro::Schema, payload: &[u8]) -> Result<Bytes, String> {
    let mut reader = payload;
    let value = apache_avro::reader::datum::GenericDatumReader::builder(schema)
        .build()
        .and_then(|r| r.read_value(&mut reader))
        .map_err(|e| format!("schema id {id}: the payload does not decode as Avro: {e}"))?;
    if !reader.is_empty() {
        return Err(format!(
            "schema id {id}: {} bytes left after the Avro value",
            reader.len()
        ));
    }
    let json = serde_json::Value::try_from(value)
        .map_err(|e| format!("schema id {id}: the Avro value has no JSON form: {e}"))?;
    serde_json::to_vec(&json)
        .map(Bytes::from)
        .map_err(|e| format!("schema id {id}: {e}"))
}

/// A plugin's JSON emit encoded with its output's schema, framed with the schema's id.
fn encode_payload(id: u32, schema: &Parsed, format: Format, value: &[u8]) -> Result<Bytes, String> {
    let json: serde_json::Value =
        serde_json::from_slice(value).map_err(|e| format!("the emit is not JSON: {e}"))?;
    let mut out = vec![0u8];
    out.extend_from_slice(&id.to_be_bytes());
    match (schema, format) {
        (Parsed::Refused(why), _) => return Err(why.clone()),
        (Parsed::Avro(schema, _), Format::Avro) => {
            let value = apache_avro::types::Value::try_from(json)
                .and_then(|v| v.resolve(schema))
                .map_err(|e| format!("the emit does not conform to the Avro schema: {e}"))?;
            let datum = apache_avro::writer::datum::GenericDatumWriter::builder(schema)
                .build()
                .and_then(|w| w.write_value_to_vec(value))
                .map_err(|e| format!("the emit does not encode as Avro: {e}"))?;
            out.extend_from_slice(&datum);
        }
        (Parsed::Protobuf(file), Format::Protobuf) => {
            // An output's emits are its schema's first message (message index [0], one zero
            // byte), as the Confluent serializer writes a file's first message.
            let message = file
                .messages()
                .next()
                .ok_or("the output's Protobuf schema has no message")?;
            let mut de = serde_json::Deserializer::from_slice(value);
            let dynamic = prost_reflect::DynamicMessage::deserialize_with_options(
                message,
                &mut de,
                &prost_reflect::DeserializeOptions::new(),
            )
            .map_err(|e| format!("the emit does not conform to the Protobuf schema: {e}"))?;
            out.push(0);
            out.extend_from_slice(&prost_reflect::prost::Message::encode_to_vec(&dynamic));
        }
        (Parsed::Json(validator), Format::JsonSchema) => {
            if let Err(e) = validator.validate(&json) {
                let at = e.instance_path().to_string();
                return Err(format!(
                    "the emit does not conform to the JSON Schema: {e}{}",
                    if at.is_empty() {
                        String::new()
                    } else {
                        format!(" (at {at})")
                    }
                ));
            }
            out.extend_from_slice(value);
        }
        (_, f) => {
            return Err(format!(
                "the subject's latest schema is not {} as the pipeline says",
                f.name()
            ));
        }
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = r#"{"type":"record","name":"Order","fields":[
        {"name":"id","type":"string"},{"name":"amount","type":"double"},
        {"name":"tags","type":{"type":"array","items":"string"}},
        {"name":"note","type":["null","string"],"default":null}]}"#;

    fn avro(schema: &str) -> Parsed {
        parse_schema(&SchemaAnswer {
            schema: schema.into(),
            schema_type: None,
            id: None,
        })
    }

    #[test]
    fn the_framing_is_a_zero_byte_and_a_big_endian_id() {
        assert_eq!(framing(&[0, 0, 0, 1, 2, 9]), Ok((258, &[9u8][..])));
        assert!(
            framing(&[0, 0, 1])
                .expect_err("refused")
                .contains("too short")
        );
        assert!(
            framing(b"{\"a\":1}")
                .expect_err("refused")
                .contains("first byte is 123")
        );
        assert!(framing(&[]).expect_err("refused").contains("empty"));
    }

    #[test]
    fn an_avro_payload_becomes_json_and_json_goes_back_to_the_same_bytes() {
        let schema = avro(ORDER);
        let json = br#"{"id":"o-1","amount":12.5,"tags":["a","b"],"note":"hi"}"#;
        let framed = encode_payload(7, &schema, Format::Avro, json).expect("encodes");
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 7]);
        let (id, payload) = framing(&framed).expect("framed");
        let decoded = decode_payload(id, &schema, Format::Avro, payload).expect("decodes");
        let back: serde_json::Value = serde_json::from_slice(&decoded).expect("JSON");
        assert_eq!(
            back,
            serde_json::json!({"id": "o-1", "amount": 12.5, "tags": ["a", "b"], "note": "hi"})
        );
        let again = encode_payload(7, &schema, Format::Avro, &decoded).expect("encodes");
        assert_eq!(again, framed);
    }

    #[test]
    fn an_emit_that_does_not_conform_is_refused_naming_why() {
        let schema = avro(ORDER);
        let why =
            encode_payload(7, &schema, Format::Avro, br#"{"id":"o-1"}"#).expect_err("refused");
        assert!(why.contains("does not conform"), "{why}");
        let why = encode_payload(7, &schema, Format::Avro, b"not json").expect_err("refused");
        assert!(why.contains("not JSON"), "{why}");
    }

    #[test]
    fn a_hostile_payload_is_a_reason_never_a_panic_nor_a_huge_allocation() {
        apache_avro::util::max_allocation_bytes(MAX_AVRO_ALLOCATION);
        let schema = avro(ORDER);
        // A string claiming 2^62 bytes, an array claiming 2^62 items, garbage, and a valid
        // value with bytes after it.
        let cases: [&[u8]; 4] = [
            &[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
            &[
                2, b'a', 0, 0, 0, 0, 0, 0, 0x29, 0x40, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                0xff, 0xff, 0x7f,
            ],
            &[0xff; 64],
            &[2, b'a', 0, 0, 0, 0, 0, 0, 0x29, 0x40, 0, 0, 1, 2, 3],
        ];
        for payload in cases {
            let why = decode_payload(3, &schema, Format::Avro, payload).expect_err("refused");
            assert!(why.starts_with("schema id 3: "), "{why}");
        }
    }

    #[test]
    fn recursive_and_unknown_schema_types_are_refused_with_a_reason() {
        let list = avro(
            r#"{"type":"record","name":"Node","fields":[{"name":"next","type":["null","Node"]}]}"#,
        );
        match list {
            Parsed::Refused(why) => assert!(why.contains("recursive"), "{why}"),
            other => panic!("{other:?}"),
        }
        let proto = parse_schema(&SchemaAnswer {
            schema: "syntax = \"proto3\";".into(),
            schema_type: Some("PROTOBUF".into()),
            id: None,
        });
        let why = decode_payload(4, &proto, Format::Avro, b"").expect_err("refused");
        assert!(why.contains("is Protobuf, not avro"), "{why}");
        let why = decode_payload(5, &avro(ORDER), Format::JsonSchema, b"{}").expect_err("refused");
        assert!(why.contains("is Avro, not json-schema"), "{why}");
    }

    #[test]
    fn a_json_schema_emit_is_validated_and_framed_and_a_bad_schema_refused() {
        let json = |schema: &str| {
            parse_schema(&SchemaAnswer {
                schema: schema.into(),
                schema_type: Some("JSON".into()),
                id: None,
            })
        };
        let schema = json(
            r#"{"type":"object","properties":{"score":{"type":"integer","maximum":50}},"required":["score"]}"#,
        );
        let framed =
            encode_payload(9, &schema, Format::JsonSchema, br#"{"score":12}"#).expect("conforms");
        assert_eq!(&framed[..], &b"\0\0\0\0\x09{\"score\":12}"[..]);
        let why = encode_payload(9, &schema, Format::JsonSchema, br#"{"score":70}"#)
            .expect_err("over the maximum");
        assert!(
            why.contains("does not conform to the JSON Schema") && why.contains("/score"),
            "{why}"
        );
        let decoded = decode_payload(9, &schema, Format::JsonSchema, br#"{"score":70}"#)
            .expect("records are taken as written");
        assert_eq!(&decoded[..], br#"{"score":70}"#);
        match json(r#"{"$ref":"https://example.invalid/remote.json"}"#) {
            Parsed::Refused(why) => assert!(why.contains("does not compile"), "{why}"),
            other => panic!("a remote reference is never fetched: {other:?}"),
        }
    }

    const ORDER_PROTO: &str = "syntax = \"proto3\";\npackage t;\nmessage Order {\n  string id = 1;\n  double amount = 2;\n  int32 quantity = 3;\n  message Line { string sku = 1; }\n}\nmessage Other { bool b = 1; }\n";

    fn proto() -> Parsed {
        parse_schema(&SchemaAnswer {
            schema: ORDER_PROTO.into(),
            schema_type: Some("PROTOBUF".into()),
            id: None,
        })
    }

    #[test]
    fn a_protobuf_payload_becomes_json_by_its_message_indexes_and_json_goes_back() {
        let schema = proto();
        let framed = encode_payload(
            4,
            &schema,
            Format::Protobuf,
            br#"{"id":"o-1","amount":12.5,"quantity":3}"#,
        )
        .expect("encodes");
        assert_eq!(&framed[..6], &[0, 0, 0, 0, 4, 0], "id 4, message index [0]");
        let (id, payload) = framing(&framed).expect("framed");
        let json = decode_payload(id, &schema, Format::Protobuf, payload).expect("decodes");
        let v: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
        assert_eq!(
            v,
            serde_json::json!({"id": "o-1", "amount": 12.5, "quantity": 3})
        );
        // Indexes [1]: the file's second message; [0, 0]: Order's nested Line.
        let other = decode_payload(4, &schema, Format::Protobuf, &[2, 2, 8, 1]).expect("Other");
        assert_eq!(&other[..], br#"{"b":true}"#);
        let line =
            decode_payload(4, &schema, Format::Protobuf, &[4, 0, 0, 10, 1, b'x']).expect("Line");
        assert_eq!(&line[..], br#"{"sku":"x"}"#);
        let why = encode_payload(4, &schema, Format::Protobuf, br#"{"nope":1}"#)
            .expect_err("an unknown field");
        assert!(
            why.contains("does not conform to the Protobuf schema"),
            "{why}"
        );
    }

    #[test]
    fn a_hostile_protobuf_payload_is_a_reason() {
        let schema = proto();
        for payload in [
            &[][..],
            &[0x7f],
            &[0xfe, 0xff, 0xff, 0xff, 0x0f],
            &[2, 40],
            &[0, 0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f],
            &[0xff; 12],
        ] {
            let why = decode_payload(6, &schema, Format::Protobuf, payload).expect_err("refused");
            assert!(why.starts_with("schema id 6: "), "{why}");
        }
        match parse_schema(&SchemaAnswer {
            schema: "syntax = \"proto3\"; import \"secret/file.proto\";".into(),
            schema_type: Some("PROTOBUF".into()),
            id: None,
        }) {
            Parsed::Refused(why) => assert!(why.contains("does not compile"), "{why}"),
            other => panic!("no file is read from disk: {other:?}"),
        }
    }

    #[test]
    fn kept_schemas_are_bounded() {
        let mut kept = Kept::default();
        for id in 0..(MAX_SCHEMAS as u32 + 10) {
            kept.put(id, None);
        }
        assert_eq!(kept.map.len(), MAX_SCHEMAS);
        assert!(!kept.map.contains_key(&0));
        assert!(kept.map.contains_key(&(MAX_SCHEMAS as u32 + 9)));
    }

    #[test]
    fn a_registry_url_must_be_http_with_a_host_and_auth_is_never_printed() {
        assert!(Registry::new("ftp://x", None, None).is_err());
        assert!(Registry::new("not a url", None, None).is_err());
        let r = Registry::new(
            "http://127.0.0.1:18081/apis/ccompat/v7/",
            Some(RegistryAuth::Basic {
                username: "u".into(),
                password: "hunter2".into(),
            }),
            None,
        )
        .expect("registry");
        let ep = r.endpoint.as_ref().expect("an endpoint");
        assert_eq!(ep.prefix, "/apis/ccompat/v7");
        assert_eq!((ep.host.as_str(), ep.port), ("127.0.0.1", 18081));
        assert!(!format!("{r:?}").contains("hunter2"));
        let auth = RegistryAuth::Bearer("t0ken".into());
        assert!(!format!("{auth:?}").contains("t0ken"));
    }

    #[test]
    fn schema_files_are_numbered_unless_given_an_id_and_may_not_share_an_id_or_subject() {
        let dir =
            std::env::temp_dir().join(format!("sharehost-schema-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let order = dir.join("order.avsc");
        std::fs::write(&order, ORDER).expect("write");
        let file = |s: &str| {
            s.replace("FILE", &order.display().to_string())
                .parse::<SchemaFile>()
                .expect("parses")
        };
        let r = Registry::from_files(&[
            file("a-value=FILE"),
            file("b-value@7=FILE"),
            file("c-value=FILE"),
        ])
        .expect("three files");
        let ids: Vec<u32> = ["a-value", "b-value", "c-value"]
            .iter()
            .map(|s| r.latest.lock()[*s].0)
            .collect();
        assert_eq!(ids, [1, 7, 8]);
        for files in [
            vec![file("a-value=FILE"), file("a-value@2=FILE")],
            vec![file("a-value@3=FILE"), file("b-value@3=FILE")],
        ] {
            assert!(matches!(
                Registry::from_files(&files),
                Err(SchemaSetupError::File(_))
            ));
        }
        // A link named like a schema to an endless device is refused after the bound.
        let zero = dir.join("zero.avsc");
        let _ = std::fs::remove_file(&zero);
        std::os::unix::fs::symlink("/dev/zero", &zero).expect("link");
        let refused = Registry::from_files(&[file(&format!("z-value={}", zero.display()))]);
        assert!(
            matches!(&refused, Err(SchemaSetupError::File(why)) if why.contains("larger than 4 MiB")),
            "{refused:?}"
        );
        assert!("a-value@-1=x.avsc".parse::<SchemaFile>().is_err());
        assert!("a-value".parse::<SchemaFile>().is_err());
    }
}
