//! Accept any HTTP/2 `:authority` on the plugin socket.
//!
//! Kubelets before Kubernetes 1.26 (grpc-go dialing a Unix socket path) send the socket path, e.g.
//! `/var/lib/kubelet/device-plugins/carma.sock`, as the request's `:authority`. The HTTP/2 library
//! under tonic (h2) rejects such a value as a malformed authority and resets the stream, so those
//! kubelets could never call the plugin. Every accepted connection therefore passes through
//! [`normalize`]: client-to-server header blocks are decoded (HPACK, keeping the client's dynamic
//! table), an `:authority` that is not a valid URI authority becomes `localhost`, and each block is
//! re-encoded as literals without indexing (so the server's table stays empty and in step). All
//! other frames, and the whole server-to-client direction, pass through untouched.

use httlib_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tracing::debug;

/// The client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Largest frame payload the server accepts by default (SETTINGS_MAX_FRAME_SIZE).
const MAX_FRAME: usize = 16_384;
/// Largest frame accepted from a client at all (the protocol's limit).
const MAX_FRAME_LIMIT: usize = (1 << 24) - 1;

/// Why a connection could not be rewritten.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// Not an HTTP/2 connection or a malformed frame sequence.
    #[error("HTTP/2 framing: {0}")]
    Framing(&'static str),
    /// A header block could not be decoded.
    #[error("HPACK: {0:?}")]
    Hpack(String),
    /// The socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Whether `value` is usable as an HTTP/2 `:authority` by the server.
pub fn authority_is_valid(value: &[u8]) -> bool {
    !value.is_empty() && http::uri::Authority::try_from(value).is_ok()
}

/// Rewrites the client-to-server bytes of one connection.
#[derive(Debug, Default)]
pub struct HeaderRewriter {
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
    /// Header block being assembled: stream, flags of the HEADERS frame, priority bytes, fragment.
    pending: Option<(u32, u8, Vec<u8>, Vec<u8>)>,
    preface_seen: bool,
    /// How many `:authority` values were replaced.
    pub rewritten: u64,
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

impl HeaderRewriter {
    /// Consume complete frames from the front of `input` and append the bytes to send to `out`.
    /// Incomplete data stays in `input`.
    pub fn process(&mut self, input: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        if !self.preface_seen {
            let n = input.len().min(PREFACE.len());
            if input[..n] != PREFACE[..n] {
                return Err(RewriteError::Framing("missing client preface"));
            }
            if n < PREFACE.len() {
                return Ok(());
            }
            out.extend_from_slice(PREFACE);
            input.drain(..PREFACE.len());
            self.preface_seen = true;
        }
        let mut at = 0;
        while input.len() - at >= 9 {
            let h = &input[at..at + 9];
            let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
            if len > MAX_FRAME_LIMIT {
                return Err(RewriteError::Framing("frame too large"));
            }
            if input.len() - at < 9 + len {
                break;
            }
            let (kind, flags) = (h[3], h[4]);
            let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
            let payload = &input[at + 9..at + 9 + len];
            match kind {
                FRAME_HEADERS => {
                    if self.pending.is_some() {
                        return Err(RewriteError::Framing("HEADERS inside a header block"));
                    }
                    let mut p = payload;
                    let mut pad = 0usize;
                    if flags & FLAG_PADDED != 0 {
                        let (&n, rest) = p
                            .split_first()
                            .ok_or(RewriteError::Framing("short HEADERS"))?;
                        pad = usize::from(n);
                        p = rest;
                    }
                    let mut priority = Vec::new();
                    if flags & FLAG_PRIORITY != 0 {
                        if p.len() < 5 {
                            return Err(RewriteError::Framing("short HEADERS priority"));
                        }
                        priority.extend_from_slice(&p[..5]);
                        p = &p[5..];
                    }
                    if pad > p.len() {
                        return Err(RewriteError::Framing("padding longer than HEADERS"));
                    }
                    let fragment = p[..p.len() - pad].to_vec();
                    self.pending = Some((stream, flags, priority, fragment));
                    if flags & FLAG_END_HEADERS != 0 {
                        self.finish_block(out)?;
                    }
                }
                FRAME_CONTINUATION => {
                    let Some((s, _, _, fragment)) = self.pending.as_mut() else {
                        return Err(RewriteError::Framing("CONTINUATION without HEADERS"));
                    };
                    if *s != stream {
                        return Err(RewriteError::Framing("CONTINUATION of another stream"));
                    }
                    fragment.extend_from_slice(payload);
                    if flags & FLAG_END_HEADERS != 0 {
                        self.finish_block(out)?;
                    }
                }
                _ => {
                    if self.pending.is_some() {
                        return Err(RewriteError::Framing("frame inside a header block"));
                    }
                    out.extend_from_slice(&input[at..at + 9 + len]);
                }
            }
            at += 9 + len;
        }
        input.drain(..at);
        Ok(())
    }

    fn finish_block(&mut self, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let Some((stream, flags, priority, mut block)) = self.pending.take() else {
            return Ok(());
        };
        let mut fields = Vec::new();
        self.decoder
            .decode(&mut block, &mut fields)
            .map_err(|e| RewriteError::Hpack(format!("{e:?}")))?;
        let mut encoded = Vec::with_capacity(block.len() + 64);
        for (name, mut value, field_flags) in fields {
            if name == b":authority" && !authority_is_valid(&value) {
                debug!(authority = %String::from_utf8_lossy(&value), "replacing an invalid :authority with localhost");
                value = b"localhost".to_vec();
                self.rewritten += 1;
            }
            let never = field_flags & Decoder::NEVER_INDEXED;
            self.encoder
                .encode((name, value, never), &mut encoded)
                .map_err(|e| RewriteError::Hpack(format!("{e:?}")))?;
        }
        // HEADERS (with the priority bytes, no padding), then CONTINUATION frames if needed.
        let first_room = MAX_FRAME - priority.len();
        let (first, mut rest) = encoded.split_at(encoded.len().min(first_room));
        let mut payload = priority;
        payload.extend_from_slice(first);
        let end_headers = if rest.is_empty() { FLAG_END_HEADERS } else { 0 };
        frame(
            out,
            FRAME_HEADERS,
            (flags & (FLAG_END_STREAM | FLAG_PRIORITY)) | end_headers,
            stream,
            &payload,
        );
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME));
            rest = tail;
            let end = if rest.is_empty() { FLAG_END_HEADERS } else { 0 };
            frame(out, FRAME_CONTINUATION, end, stream, chunk);
        }
        Ok(())
    }
}

async fn rewrite<R, W>(mut from: R, mut to: W) -> Result<(), RewriteError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut rewriter = HeaderRewriter::default();
    let mut input = Vec::with_capacity(16 * 1024);
    let mut out = Vec::with_capacity(16 * 1024);
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            let _ = to.shutdown().await;
            return Ok(());
        }
        input.extend_from_slice(&buf[..n]);
        rewriter.process(&mut input, &mut out)?;
        if !out.is_empty() {
            to.write_all(&out).await?;
            to.flush().await?;
            out.clear();
        }
    }
}

/// Put a connection behind the `:authority` normalizer; serve the returned stream instead.
pub fn normalize<S>(conn: S) -> DuplexStream
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let (conn_r, mut conn_w) = tokio::io::split(conn);
        let (mut ours_r, ours_w) = tokio::io::split(ours);
        let c2s = async {
            if let Err(e) = rewrite(conn_r, ours_w).await {
                debug!("plugin connection closed: {e}");
                return;
            }
            // The client finished sending; keep answering until the server is done.
            std::future::pending::<()>().await
        };
        let s2c = async {
            let _ = tokio::io::copy(&mut ours_r, &mut conn_w).await;
            let _ = conn_w.shutdown().await;
        };
        tokio::select! {
            _ = c2s => {}
            _ = s2c => {}
        }
    });
    theirs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(enc: &mut Encoder<'static>, fields: &[(&str, &str, u8)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (n, v, f) in fields {
            enc.encode((n.as_bytes().to_vec(), v.as_bytes().to_vec(), *f), &mut out)
                .unwrap();
        }
        out
    }

    type Frame = (u8, u8, Vec<(String, String)>);

    fn decode_frames(bytes: &[u8], dec: &mut Decoder<'static>) -> Vec<Frame> {
        let mut at = 0;
        let mut out = Vec::new();
        while at + 9 <= bytes.len() {
            let len = usize::from(bytes[at]) << 16
                | usize::from(bytes[at + 1]) << 8
                | usize::from(bytes[at + 2]);
            let (kind, flags) = (bytes[at + 3], bytes[at + 4]);
            let mut payload = bytes[at + 9..at + 9 + len].to_vec();
            let mut fields = Vec::new();
            if kind == FRAME_HEADERS {
                let mut raw = Vec::new();
                dec.decode(&mut payload, &mut raw).unwrap();
                fields = raw
                    .into_iter()
                    .map(|(n, v, _)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
                    .collect();
            }
            out.push((kind, flags, fields));
            at += 9 + len;
        }
        out
    }

    #[test]
    fn authority_validity() {
        assert!(authority_is_valid(b"localhost"));
        assert!(authority_is_valid(b"[::]:50051"));
        assert!(!authority_is_valid(
            b"/var/lib/kubelet/device-plugins/carma.sock"
        ));
        assert!(!authority_is_valid(b""));
    }

    #[test]
    fn socket_path_authority_becomes_localhost_across_indexed_requests() {
        // A client encoder that indexes (as grpc-go's does) and Huffman-codes values.
        let mut client = Encoder::default();
        let flags = Encoder::WITH_INDEXING | Encoder::HUFFMAN_VALUE | Encoder::BEST_FORMAT;
        let req = [
            (":method", "POST", flags),
            (":scheme", "http", flags),
            (":path", "/v1beta1.DevicePlugin/Allocate", flags),
            (
                ":authority",
                "/var/lib/kubelet/device-plugins/carma.sock",
                flags,
            ),
            ("content-type", "application/grpc", flags),
        ];
        let mut input = PREFACE.to_vec();
        frame(&mut input, 0x4, 0, 0, &[]); // SETTINGS
        let b1 = block(&mut client, &req);
        frame(&mut input, FRAME_HEADERS, FLAG_END_HEADERS, 1, &b1);
        frame(&mut input, 0x0, FLAG_END_STREAM, 1, &[0, 0, 0, 0, 0]); // DATA
        // The second request refers to the indexed :authority; split over HEADERS + CONTINUATION.
        let b2 = block(&mut client, &req);
        let (x, y) = b2.split_at(3);
        frame(
            &mut input,
            FRAME_HEADERS,
            FLAG_END_STREAM | FLAG_PADDED,
            3,
            &[&[2u8][..], x, &[0, 0]].concat(),
        );
        frame(&mut input, FRAME_CONTINUATION, FLAG_END_HEADERS, 3, y);

        let mut rw = HeaderRewriter::default();
        let mut out = Vec::new();
        // Feed byte by byte: framing must survive any split.
        let mut pending = Vec::new();
        for b in &input {
            pending.push(*b);
            rw.process(&mut pending, &mut out).unwrap();
        }
        assert!(pending.is_empty());
        assert_eq!(rw.rewritten, 2);
        assert!(out.starts_with(PREFACE));
        let mut server = Decoder::default();
        let frames = decode_frames(&out[PREFACE.len()..], &mut server);
        let kinds: Vec<u8> = frames.iter().map(|f| f.0).collect();
        assert_eq!(kinds, [0x4, FRAME_HEADERS, 0x0, FRAME_HEADERS]);
        for (_, flags, fields) in frames.iter().filter(|f| f.0 == FRAME_HEADERS) {
            assert!(flags & FLAG_END_HEADERS != 0);
            assert!(
                fields.contains(&(":authority".into(), "localhost".into())),
                "{fields:?}"
            );
            assert!(fields.contains(&(":path".into(), "/v1beta1.DevicePlugin/Allocate".into())));
        }
        assert_eq!(frames[3].1 & FLAG_END_STREAM, FLAG_END_STREAM);
    }

    #[test]
    fn valid_authority_is_kept_and_garbage_is_refused() {
        let mut client = Encoder::default();
        let mut input = PREFACE.to_vec();
        let b = block(&mut client, &[(":authority", "localhost", 0)]);
        frame(&mut input, FRAME_HEADERS, FLAG_END_HEADERS, 1, &b);
        let mut rw = HeaderRewriter::default();
        let mut out = Vec::new();
        rw.process(&mut input, &mut out).unwrap();
        assert_eq!(rw.rewritten, 0);
        let frames = decode_frames(&out[PREFACE.len()..], &mut Decoder::default());
        assert_eq!(
            frames[0].2,
            [(":authority".to_string(), "localhost".to_string())]
        );

        let mut rw = HeaderRewriter::default();
        let mut bad = b"GET / HTTP/1.1\r\n\r\n".to_vec();
        assert!(rw.process(&mut bad, &mut Vec::new()).is_err());
        let mut rw = HeaderRewriter::default();
        let mut bad = PREFACE.to_vec();
        frame(&mut bad, FRAME_CONTINUATION, FLAG_END_HEADERS, 1, &[0x82]);
        assert!(rw.process(&mut bad, &mut Vec::new()).is_err());
    }
}
