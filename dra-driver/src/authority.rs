//! Makes the kubelet's plugin-watcher calls acceptable to tonic.
//!
//! The kubelet's plugin watcher dials the registration socket by its bare path, and grpc-go then
//! sends the percent-encoded path as the HTTP/2 `:authority` (`%2Fvar%2Flib%2Fkubelet%2F…`). h2,
//! the HTTP/2 server under tonic, rejects that authority and resets the stream with
//! `PROTOCOL_ERROR`, so `GetInfo` never answers (seen with the kubelet's own code at 1.35.4, see
//! `dra-driver/check/`). The kubelet's device-plugin, CSI and DRA clients send `localhost` instead;
//! the plugin watcher does not.
//!
//! This module sits between the socket and tonic and rewrites, in the client's HEADERS frames, the
//! value of every literal `:authority` field (static name index 1) to `localhost`. It does not
//! decode HPACK strings; it only steps over them by their length prefixes. Everything else passes
//! through unchanged, and so does any header block it cannot parse or that spans CONTINUATION
//! frames.
//!
//! One caveat is HPACK's dynamic table. With incremental indexing, the client stores the long
//! path, while h2 stores `localhost`. The two tables stay in step (same entries, same indices)
//! until the client starts evicting entries, which happens after 4096 bytes of distinct headers on
//! one connection. The plugin watcher makes two calls per connection, far below that.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADERS: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// `:authority` in HPACK's static table.
const AUTHORITY_INDEX: u64 = 1;
const LOCALHOST: &[u8] = b"localhost";

/// Copy an HTTP/2 client's bytes from `from` to `to`, rewriting `:authority` to `localhost`.
pub async fn forward_fixing_authority<R, W>(mut from: R, mut to: W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    if &preface != PREFACE {
        // Not HTTP/2 with prior knowledge: let the server reject it.
        tokio::io::copy(&mut from, &mut to).await?;
        return to.shutdown().await;
    }
    let mut header = [0u8; 9];
    loop {
        match from.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return to.shutdown().await,
            Err(e) => return Err(e),
        }
        let len =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let mut payload = vec![0u8; len];
        from.read_exact(&mut payload).await?;
        match (header[3] == FRAME_HEADERS)
            .then(|| rewrite_headers_frame(header[4], &payload))
            .flatten()
        {
            Some((flags, rewritten)) => {
                let n = rewritten.len();
                let mut h = header;
                h[0..3].copy_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8]);
                h[4] = flags;
                to.write_all(&h).await?;
                to.write_all(&rewritten).await?;
            }
            None => {
                to.write_all(&header).await?;
                to.write_all(&payload).await?;
            }
        }
        to.flush().await?;
    }
}

/// A HEADERS frame's new flags and payload, or `None` to pass it through unchanged (no complete
/// header block, or one that cannot be parsed). Padding is dropped; the priority is kept.
fn rewrite_headers_frame(flags: u8, payload: &[u8]) -> Option<(u8, Vec<u8>)> {
    if flags & FLAG_END_HEADERS == 0 {
        return None;
    }
    let (mut start, mut end): (usize, usize) = (0, payload.len());
    if flags & FLAG_PADDED != 0 {
        let pad = usize::from(*payload.first()?);
        start = 1;
        end = end.checked_sub(pad)?;
    }
    let priority = if flags & FLAG_PRIORITY != 0 { 5 } else { 0 };
    let block_start = start.checked_add(priority)?;
    if block_start > end {
        return None;
    }
    let block = rewrite_block(&payload[block_start..end])?;
    let mut out = payload[start..block_start].to_vec();
    out.extend_from_slice(&block);
    Some((flags & !FLAG_PADDED, out))
}

/// An HPACK integer with an `prefix`-bit prefix at `b[i..]`: its value and its length in bytes.
fn integer(b: &[u8], i: usize, prefix: u32) -> Option<(u64, usize)> {
    let mask = (1u64 << prefix) - 1;
    let mut value = u64::from(*b.get(i)?) & mask;
    if value < mask {
        return Some((value, 1));
    }
    let mut shift = 0;
    for (k, &byte) in b.get(i + 1..)?.iter().enumerate() {
        value = value.checked_add(u64::from(byte & 0x7f).checked_shl(shift)?)?;
        if byte & 0x80 == 0 {
            return Some((value, k + 2));
        }
        shift += 7;
        if shift > 56 {
            return None;
        }
    }
    None
}

/// The end of the HPACK string starting at `b[i..]`.
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    let (len, n) = integer(b, i, 7)?;
    let end = i.checked_add(n)?.checked_add(usize::try_from(len).ok()?)?;
    (end <= b.len()).then_some(end)
}

/// The header block with every literal `:authority` value replaced by `localhost`.
fn rewrite_block(b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let first = b[i];
        let prefix = match first {
            f if f & 0x80 != 0 => 7,    // indexed field
            f if f & 0xc0 == 0x40 => 6, // literal with incremental indexing
            f if f & 0xe0 == 0x20 => 5, // dynamic table size update
            _ => 4,                     // literal without indexing / never indexed
        };
        let (index, n) = integer(b, i, prefix)?;
        if prefix == 7 || prefix == 5 {
            out.extend_from_slice(&b[i..i + n]);
            i += n;
            continue;
        }
        let mut value_start = i + n;
        if index == 0 {
            value_start = string_end(b, value_start)?;
        }
        let value_end = string_end(b, value_start)?;
        if index == AUTHORITY_INDEX {
            out.extend_from_slice(&b[i..value_start]);
            out.push(LOCALHOST.len() as u8); // not Huffman-coded; 9 fits the 7-bit prefix
            out.extend_from_slice(LOCALHOST);
        } else {
            out.extend_from_slice(&b[i..value_end]);
        }
        i = value_end;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn literal(first: u8, value: &[u8]) -> Vec<u8> {
        let mut v = vec![first, value.len() as u8];
        v.extend_from_slice(value);
        v
    }

    /// A block as grpc-go writes it: :method POST, :scheme http (indexed), :path and :authority as
    /// literals with incremental indexing, content-type with a literal name.
    fn block(authority: &[u8], huffman_flag: bool) -> Vec<u8> {
        let mut b = vec![0x83, 0x86];
        b.extend(literal(0x44, b"/pluginregistration.Registration/GetInfo"));
        let mut a = literal(0x41, authority);
        if huffman_flag {
            a[1] |= 0x80; // the bytes are stepped over, never decoded
        }
        b.extend(a);
        b.push(0x40);
        b.extend(&literal(0x00, b"content-type")[1..]);
        b.extend(&literal(0x00, b"application/grpc")[1..]);
        b
    }

    #[test]
    fn the_authority_literal_becomes_localhost_and_nothing_else_changes() {
        let path = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.carma.io-reg.sock";
        for huffman in [false, true] {
            let out = rewrite_block(&block(path, huffman)).unwrap();
            assert_eq!(out, block(b"localhost", false), "huffman flag {huffman}");
        }
        // Without an authority the block is unchanged.
        let mut b = vec![0x83, 0x86, 0xbe];
        b.extend(literal(0x44, b"/x"));
        assert_eq!(rewrite_block(&b).unwrap(), b);
    }

    #[test]
    fn long_values_and_never_indexed_literals_are_stepped_over() {
        // 0x10: never indexed, literal name "x"; 0x7f 0xad 0x01 is the length 300 (127 + 173).
        let mut b = vec![0x10, 0x01, b'x', 0x7f, 0xad, 0x01];
        b.extend(vec![b'a'; 300]);
        b.extend(literal(0x01, b"/tmp/a.sock")); // without indexing, name index 1
        let out = rewrite_block(&b).unwrap();
        assert_eq!(out[..b.len() - 13], b[..b.len() - 13]);
        assert_eq!(&out[out.len() - 11..], b"\x01\x09localhost");
        assert!(rewrite_block(&[0x41, 0x7f]).is_none(), "truncated");
    }

    #[test]
    fn padded_headers_frames_lose_their_padding_and_keep_priority() {
        let blk = block(b"/a.sock", false);
        let mut payload = vec![3]; // pad length
        payload.extend([0, 0, 0, 1, 16]); // priority
        payload.extend(&blk);
        payload.extend([0, 0, 0]);
        let (flags, out) =
            rewrite_headers_frame(FLAG_END_HEADERS | FLAG_PADDED | FLAG_PRIORITY, &payload)
                .unwrap();
        assert_eq!(flags, FLAG_END_HEADERS | FLAG_PRIORITY);
        assert_eq!(out[..5], [0, 0, 0, 1, 16]);
        assert_eq!(out[5..], block(b"localhost", false));
        assert!(
            rewrite_headers_frame(0, &blk).is_none(),
            "CONTINUATION follows"
        );
    }

    #[tokio::test]
    async fn frames_are_forwarded_with_the_authority_fixed() {
        let blk = block(b"/a.sock", false);
        let mut input = PREFACE.to_vec();
        input.extend([0, 0, 0, 0x4, 0, 0, 0, 0, 0]); // empty SETTINGS
        let n = blk.len();
        input.extend([0, 0, n as u8, FRAME_HEADERS, FLAG_END_HEADERS, 0, 0, 0, 1]);
        input.extend(&blk);
        let mut output = Vec::new();
        forward_fixing_authority(&input[..], &mut output)
            .await
            .unwrap();
        let fixed = block(b"localhost", false);
        let mut expected = PREFACE.to_vec();
        expected.extend([0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
        expected.extend([
            0,
            0,
            fixed.len() as u8,
            FRAME_HEADERS,
            FLAG_END_HEADERS,
            0,
            0,
            0,
            1,
        ]);
        expected.extend(&fixed);
        assert_eq!(output, expected);
    }
}
