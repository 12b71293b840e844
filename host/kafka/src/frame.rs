//! Length-prefixed Kafka frames: building a request frame and reading a response frame with a
//! hard size limit. Pure functions plus one reader; no connection state.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::bounded;

/// Default largest response frame we accept. Fetch responses are bounded by MaxBytes (we ask
/// for far less), so anything bigger is a corrupt or hostile length prefix.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 100 * 1024 * 1024;

/// How much we allocate ahead of the bytes actually received, so a lying length prefix costs at
/// most this much memory before the peer has to prove it by sending data.
const READ_CHUNK: usize = 64 * 1024;

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer announced a frame larger than we accept.
    #[error("frame length {size} exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Announced length.
        size: i64,
        /// Our limit.
        limit: usize,
    },
    /// The peer announced a negative or too-short length.
    #[error("invalid frame length {0}")]
    BadLength(i32),
    /// The stream ended, cleanly between frames or in the middle of one.
    #[error("connection closed by the peer{}", if *.mid_frame { " in the middle of a frame" } else { "" })]
    Closed {
        /// Whether part of a frame had been read.
        mid_frame: bool,
    },
    /// Any other I/O failure.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Encodes `header` + `body` as one length-prefixed frame, ready to write in one go.
pub fn encode_request<B: Encodable>(
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    client_id: &str,
    body: &B,
) -> anyhow::Result<Bytes> {
    let header = RequestHeader::default()
        .with_request_api_key(api as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_string(client_id.to_owned())));
    let header_version = api.request_header_version(version);
    let mut buf = BytesMut::with_capacity(
        4 + header.compute_size(header_version)? + body.compute_size(version)?,
    );
    buf.put_i32(0); // patched below
    header.encode(&mut buf, header_version)?;
    body.encode(&mut buf, version)?;
    let len = i32::try_from(buf.len() - 4)?;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf.freeze())
}

/// The correlation id of a response frame (its first four bytes), without consuming it.
pub fn peek_correlation_id(frame: &[u8]) -> Option<i32> {
    let b: [u8; 4] = frame.get(..4)?.try_into().ok()?;
    Some(i32::from_be_bytes(b))
}

/// Strips the response header (whose version depends on the API and version) and decodes the body.
///
/// The one place every response the host receives is decoded: the body first goes through
/// [`bounded::check_body`], which refuses any length that claims more than the bytes left, so
/// kafka-protocol (which allocates from those lengths before reading the elements) never sees a
/// lying one. The header needs no check: it holds only the correlation id and tagged fields,
/// which kafka-protocol reads with bounded reads.
pub fn decode_response<R: Decodable + HeaderVersion>(
    mut frame: Bytes,
    api: ApiKey,
    version: i16,
) -> anyhow::Result<R> {
    let header_version = api.response_header_version(version);
    ResponseHeader::decode(&mut frame, header_version)?;
    bounded::check_body(api, version, &frame)?;
    let body = R::decode(&mut frame, version)?;
    if frame.has_remaining() {
        anyhow::bail!("{} unexpected trailing bytes", frame.remaining());
    }
    Ok(body)
}

/// Reads one frame (without its length prefix).
///
/// # Cancel safety
/// Not cancel safe: dropping the future mid-frame loses stream position. Only the connection's
/// reader task calls it, and that task is never cancelled except when the connection dies.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_frame_bytes: usize,
) -> Result<Bytes, FrameError> {
    let mut len_buf = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = reader.read(&mut len_buf[got..]).await?;
        if n == 0 {
            return Err(FrameError::Closed { mid_frame: got > 0 });
        }
        got += n;
    }
    let len = i32::from_be_bytes(len_buf);
    if len < 4 {
        // Every response starts with a 4-byte correlation id.
        return Err(FrameError::BadLength(len));
    }
    let len = len as usize;
    if len > max_frame_bytes {
        return Err(FrameError::TooLarge {
            size: len as i64,
            limit: max_frame_bytes,
        });
    }
    let mut buf = BytesMut::with_capacity(len.min(READ_CHUNK));
    while buf.len() < len {
        if buf.capacity() == buf.len() {
            buf.reserve((len - buf.len()).min(READ_CHUNK));
        }
        let want = (len - buf.len()).min(buf.capacity() - buf.len());
        let n = (&mut *reader).take(want as u64).read_buf(&mut buf).await?;
        if n == 0 {
            return Err(FrameError::Closed { mid_frame: true });
        }
    }
    Ok(buf.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{ApiVersionsRequest, MetadataRequest};
    use tokio::io::AsyncWriteExt;

    #[test]
    fn request_frame_has_length_prefix_and_header() {
        let req = MetadataRequest::default();
        let frame = encode_request(ApiKey::Metadata, 12, 42, "sharehost", &req).expect("encodes");
        let mut b = frame.clone();
        let len = b.get_i32() as usize;
        assert_eq!(len, frame.len() - 4);
        let header = RequestHeader::decode(&mut b, 2).expect("header v2");
        assert_eq!(header.request_api_key, ApiKey::Metadata as i16);
        assert_eq!(header.request_api_version, 12);
        assert_eq!(header.correlation_id, 42);
        assert_eq!(header.client_id.as_deref(), Some("sharehost"));
        let body = MetadataRequest::decode(&mut b, 12);
        assert!(body.is_ok());
    }

    #[test]
    fn api_versions_uses_old_header_for_its_response() {
        // ApiVersions responses always use header v0 so clients can parse them before
        // negotiating; decode_response must honour that.
        let mut resp = BytesMut::new();
        resp.put_i32(7); // correlation id, header v0 has no tagged fields
        let body = kafka_protocol::messages::ApiVersionsResponse::default();
        body.encode(&mut resp, 3).expect("encode");
        let decoded: kafka_protocol::messages::ApiVersionsResponse =
            decode_response(resp.freeze(), ApiKey::ApiVersions, 3).expect("decode");
        assert_eq!(decoded.error_code, 0);
        let _ = ApiVersionsRequest::default();
    }

    #[tokio::test]
    async fn reads_frames_across_partial_writes() {
        let (mut a, mut b) = tokio::io::duplex(7);
        let writer = tokio::spawn(async move {
            let mut f = BytesMut::new();
            f.put_i32(10);
            f.put_slice(b"0123456789");
            f.put_i32(4);
            f.put_slice(b"abcd");
            a.write_all(&f).await.expect("write");
        });
        assert_eq!(
            &read_frame(&mut b, 1024).await.expect("frame")[..],
            b"0123456789"
        );
        assert_eq!(&read_frame(&mut b, 1024).await.expect("frame")[..], b"abcd");
        writer.await.expect("join");
        assert!(matches!(
            read_frame(&mut b, 1024).await,
            Err(FrameError::Closed { mid_frame: false })
        ));
    }

    #[tokio::test]
    async fn lying_length_prefix_is_refused_without_allocating() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&i32::MAX.to_be_bytes()).await.expect("write");
        match read_frame(&mut b, DEFAULT_MAX_FRAME_BYTES).await {
            Err(FrameError::TooLarge { size, .. }) => assert_eq!(size, i32::MAX as i64),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&(-5i32).to_be_bytes()).await.expect("write");
        assert!(matches!(
            read_frame(&mut b, 1024).await,
            Err(FrameError::BadLength(-5))
        ));
    }

    #[tokio::test]
    async fn truncated_frame_reports_mid_frame_close() {
        let (mut a, mut b) = tokio::io::duplex(64);
        // Announces 1000 bytes (under the limit) but sends 3 and hangs up.
        a.write_all(&1000i32.to_be_bytes()).await.expect("write");
        a.write_all(b"abc").await.expect("write");
        drop(a);
        assert!(matches!(
            read_frame(&mut b, 1 << 20).await,
            Err(FrameError::Closed { mid_frame: true })
        ));
    }

    /// A Metadata v12 response whose broker array claims 0x7fff_fffe entries and carries three
    /// bytes. kafka-protocol alone reserves tens of gigabytes for it and the process aborts;
    /// through `decode_response` it is an error naming the lie.
    #[test]
    fn a_response_with_a_lying_array_length_is_a_decode_error_not_an_abort() {
        let mut frame = BytesMut::new();
        frame.put_i32(9); // correlation id
        frame.put_u8(0); // header v1: no tagged fields
        frame.put_i32(0); // throttle_time_ms
        frame.put_slice(&[0xff, 0xff, 0xff, 0xff, 0x07]); // compact array length 0x7fffffff
        frame.put_slice(&[0, 0, 0]);
        let err = decode_response::<kafka_protocol::messages::MetadataResponse>(
            frame.freeze(),
            ApiKey::Metadata,
            12,
        )
        .expect_err("a lying length must be refused");
        assert!(err.to_string().contains("array claims"), "{err}");
    }

    #[test]
    fn peek_reads_correlation_id() {
        assert_eq!(peek_correlation_id(&[0, 0, 1, 2, 9]), Some(258));
        assert_eq!(peek_correlation_id(&[0, 0]), None);
    }
}
