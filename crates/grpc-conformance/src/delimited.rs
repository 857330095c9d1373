//! The runner's framing on stdin and stdout: each message is preceded by
//! its length as a 4-byte big-endian integer ("size-delimited"; not the
//! varint prefix of protobuf's own delimited streams).

use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest message accepted from the runner. Its requests carry test data
/// (the largest are the message-size cases, a few MiB); a length past this
/// means the stream is not what we think it is.
const MAX_LEN: usize = 256 << 20;

/// Reads one message. `Ok(None)` at end of input on a message boundary; an
/// end inside a message, or an absurd length, is an error.
pub(crate) async fn read<R: AsyncRead + Unpin>(input: &mut R) -> Result<Option<Vec<u8>>, String> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < prefix.len() {
        match input.read(&mut prefix[got..]).await {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(format!("stdin ended inside a length prefix ({got} of 4 bytes)")),
            Ok(n) => got += n,
            Err(e) => return Err(format!("reading stdin: {e}")),
        }
    }
    let len = u32::from_be_bytes(prefix) as usize;
    if len > MAX_LEN {
        return Err(format!(
            "message length {len} on stdin exceeds {MAX_LEN}: not a size-delimited stream?"
        ));
    }
    let mut body = vec![0u8; len];
    input
        .read_exact(&mut body)
        .await
        .map_err(|e| format!("stdin ended inside a message of {len} bytes: {e}"))?;
    Ok(Some(body))
}

/// `message` with its length prefix, ready to write.
pub(crate) fn frame(message: &[u8]) -> Result<Vec<u8>, String> {
    let len = u32::try_from(message.len())
        .map_err(|_| format!("message of {} bytes is too long to frame", message.len()))?;
    let mut out = Vec::with_capacity(4 + message.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_truncation_is_an_error() {
        let mut stream = frame(b"abc").unwrap_or_default();
        stream.extend(frame(b"").unwrap_or_default());
        assert_eq!(&stream[..7], &[0, 0, 0, 3, b'a', b'b', b'c']);
        let mut r = &stream[..];
        assert_eq!(read(&mut r).await, Ok(Some(b"abc".to_vec())));
        assert_eq!(read(&mut r).await, Ok(Some(Vec::new())));
        assert_eq!(read(&mut r).await, Ok(None));
        for cut in [&[0u8, 0][..], &[0, 0, 0, 5, 1, 2][..]] {
            let mut r = cut;
            assert!(read(&mut r).await.is_err(), "{cut:?}");
        }
        let mut r = &[0xffu8, 0xff, 0xff, 0xff][..];
        assert!(read(&mut r).await.is_err());
    }
}
